from importlib import import_module

from django.db import migrations

# The standby feed's triggers (0021, 0022), two corrections:
# - A domain's record of a message it passed on (a delivery with `forward_to`) that becomes a
#   mailbox row, because the message's recipient is served here again (messaging.network.intake
#   `_served_here_again`, messaging.network.held_rows), is fed as new, as a row inserted into a
#   mailbox is (a holder feeds no records, so its home never had it).
# - A standby feeds its home only while it holds the home's users (0022 fed while a takeover row
#   existed, held or given back): every row is inserted before routing gives it a `forward_to`, so
#   each message a former holder stored on its way to the home's users went to the home twice, as a
#   copy too, which the home merged without feeding its own standby: that standby's copy lacked it.
_takeover = import_module("messaging.migrations.0022_takeover")


def _held_only(sql: str) -> str:
    assert sql.count("tk.id IS NOT NULL AND") == 1
    return sql.replace("tk.id IS NOT NULL AND", "tk.held AND")


_FEED = _held_only(_takeover._FEED)
_SUBS = _held_only(_takeover._SUBS)
_MADE_MAILBOX_ROWS = "standby_new c JOIN standby_old o ON o.id = c.id AND o.forward_to <> '' AND c.forward_to = ''"

TRIGGERS_SQL = f"""
CREATE OR REPLACE FUNCTION messaging_standby_feed_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM apps_registry_userdistribution WHERE standby_id IS NOT NULL) THEN
        {_FEED.format(new="true", rows="standby_new c")}
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION messaging_standby_feed_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM apps_registry_userdistribution WHERE standby_id IS NOT NULL) THEN
        {_FEED.format(new="false", rows=_takeover._STATE_ROWS)}
        {_FEED.format(new="true", rows=_MADE_MAILBOX_ROWS)}
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION messaging_standby_feed_subscriptions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM apps_registry_userdistribution WHERE standby_id IS NOT NULL) THEN
        IF TG_OP = 'INSERT' THEN
            {_SUBS.format(rows="standby_new c", subscribed="true")}
        ELSE
            {_SUBS.format(rows="standby_old c", subscribed="false")}
        END IF;
    END IF;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('messaging', '0022_takeover'),
    ]

    operations = [
        migrations.RunSQL(TRIGGERS_SQL, _takeover.TRIGGERS_SQL),
    ]
