from importlib import import_module

from django.db import migrations

# A domain's record of a message it passed on (a delivery with `forward_to`) becomes a mailbox row
# when the message's recipient is served here again (messaging.network.intake `_served_here_again`,
# messaging.network.held_rows `queued_into_mailboxes`): the standby feed takes it as new then, as it
# takes a row inserted into a mailbox (a holder feeds no records, so its home never had it).
_takeover = import_module("messaging.migrations.0022_takeover")

_MADE_MAILBOX_ROWS = "standby_new c JOIN standby_old o ON o.id = c.id AND o.forward_to <> '' AND c.forward_to = ''"

STATE_SQL = f"""
CREATE OR REPLACE FUNCTION messaging_standby_feed_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM apps_registry_userdistribution WHERE standby_id IS NOT NULL) THEN
        {_takeover._FEED.format(new="false", rows=_takeover._STATE_ROWS)}
        {_takeover._FEED.format(new="true", rows=_MADE_MAILBOX_ROWS)}
    END IF;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('messaging', '0022_takeover'),
    ]

    operations = [
        migrations.RunSQL(STATE_SQL, _takeover.TRIGGERS_SQL),
    ]
