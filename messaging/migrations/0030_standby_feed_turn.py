from django.db import migrations

from foundation.locks import in_turn_shared_sql
from messaging.federation.standby.feed_turn import FEED_TURN_PREFIX

# Every row joining the feed to a standby waits while a hand-back to that standby holds its turn
# (messaging.federation.standby.feed_turn), and holds it off until its own transaction ends.
# A hand-back locked the whole feed table instead (SHARE ROW EXCLUSIVE), across its call to the home:
# every store of the holder whose deliveries fed any standby waited for that call.
TURN_SQL = f"""
CREATE OR REPLACE FUNCTION messaging_standby_feed_turn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {in_turn_shared_sql(f"'{FEED_TURN_PREFIX}' || NEW.standby")};
    RETURN NEW;
END $$;
CREATE TRIGGER messaging_standby_feed_turn BEFORE INSERT ON messaging_standbyfeed
    FOR EACH ROW EXECUTE FUNCTION messaging_standby_feed_turn();
"""

UNTURN_SQL = """
DROP TRIGGER IF EXISTS messaging_standby_feed_turn ON messaging_standbyfeed;
DROP FUNCTION IF EXISTS messaging_standby_feed_turn();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('messaging', '0029_message_ids_in_domain_blocks'),
    ]

    operations = [
        migrations.RunSQL(TURN_SQL, UNTURN_SQL),
    ]
