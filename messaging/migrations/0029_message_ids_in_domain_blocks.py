from django.db import migrations

from apps_registry.models import MESSAGE_ID_BLOCK_BITS

# A domain draws the ids of the messages stored there first from its block (apps_registry Domain.number;
# docs/architecture.md, "One id per message"): once its database holds its own domain's row with a
# number (switchboard.domain: set on every connection the platform opens), the message id sequence is
# moved to the block's start, if it is below it. Whatever writes the row (the YAML import, the meta
# pull, the admin), in the statement that writes it; never moved down, so running it again, or a
# number lowered by mistake, never hands out an id twice.
PLACE_SQL = f"""
CREATE OR REPLACE FUNCTION messaging_message_ids_place() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.number IS NOT NULL AND NEW.name = current_setting('switchboard.domain', true) THEN
        PERFORM setval('messaging_message_id_seq', NEW.number::bigint << {MESSAGE_ID_BLOCK_BITS}, false)
           FROM messaging_message_id_seq s
          WHERE s.last_value < NEW.number::bigint << {MESSAGE_ID_BLOCK_BITS};
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER messaging_message_ids_place AFTER INSERT OR UPDATE OF name, number ON apps_registry_domain
    FOR EACH ROW EXECUTE FUNCTION messaging_message_ids_place();
-- A database that already holds its own domain's number (none can yet: the column is new).
UPDATE apps_registry_domain SET number = number
 WHERE number IS NOT NULL AND name = current_setting('switchboard.domain', true);
"""

UNPLACE_SQL = """
DROP TRIGGER IF EXISTS messaging_message_ids_place ON apps_registry_domain;
DROP FUNCTION IF EXISTS messaging_message_ids_place();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("apps_registry", "0017_domain_number"),
        ("messaging", "0028_pusher_channel_names_up_to_200"),
    ]

    operations = [migrations.RunSQL(PLACE_SQL, UNPLACE_SQL)]
