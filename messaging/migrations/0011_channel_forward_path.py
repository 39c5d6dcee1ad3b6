# The flood's path on each queued publish (messaging.network.flood). Numbered 0012: 0011 is the
# forwarding helper's; at the merge this migration's dependency moves to that one.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('messaging', '0010_domain_network'),
    ]

    operations = [
        migrations.AddField(
            model_name='channelforward',
            name='path',
            field=models.CharField(blank=True, db_default='', default='', max_length=800),
        ),
    ]
