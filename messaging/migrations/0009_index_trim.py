# The per-message write path writes every index of a delivery row again on each state change, and
# every index of a message once: drop the indexes that repeat another, and keep NULLs (every ordinary
# message) out of the confirmations' unique index (issue 10, docs/benchmarks.md).
#
# The database side is written by hand: Django's own operations would drop and re-add both foreign
# keys, which re-checks every row of the two largest tables while holding their locks.

import django.db.models.deletion
from django.db import migrations, models

FORWARD = """
DROP INDEX IF EXISTS messaging_delivery_app_id_c23d0ddb;
DROP INDEX IF EXISTS messaging_mailbox_app_id_1d7dd0c1;
CREATE UNIQUE INDEX message_confirmed_once ON messaging_message (confirms_id) WHERE confirms_id IS NOT NULL;
ALTER TABLE messaging_message DROP CONSTRAINT IF EXISTS messaging_message_confirms_id_key;
"""
BACKWARD = """
ALTER TABLE messaging_message ADD CONSTRAINT messaging_message_confirms_id_key UNIQUE (confirms_id);
DROP INDEX IF EXISTS message_confirmed_once;
CREATE INDEX messaging_delivery_app_id_c23d0ddb ON messaging_delivery (app_id);
CREATE INDEX messaging_mailbox_app_id_1d7dd0c1 ON messaging_mailbox (app_id);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('apps_registry', '0004_api_rate_limits'),
        ('messaging', '0008_idempotency_keys'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AlterField(
                    model_name='delivery',
                    name='app',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name='+', to='apps_registry.clientapp'),
                ),
                migrations.AlterField(
                    model_name='mailbox',
                    name='app',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name='+', to='apps_registry.clientapp'),
                ),
                migrations.AlterField(
                    model_name='message',
                    name='confirms',
                    field=models.ForeignKey(blank=True, db_index=False, null=True,
                                            on_delete=django.db.models.deletion.CASCADE, related_name='+',
                                            to='messaging.message'),
                ),
                migrations.AddConstraint(
                    model_name='message',
                    constraint=models.UniqueConstraint(condition=models.Q(('confirms__isnull', False)),
                                                       fields=('confirms',), name='message_confirmed_once'),
                ),
            ],
        ),
    ]
