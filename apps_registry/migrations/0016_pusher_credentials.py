"""Every app gets Pusher credentials: the table, and a row for each app that exists already."""

import apps_registry.pusher_credentials
import django.db.models.deletion
from django.db import migrations, models


def credentials_for_existing_apps(apps, schema_editor):
    from apps_registry.pusher_credentials import new_pusher_app_id, new_pusher_key, new_pusher_secret

    ClientApp = apps.get_model("apps_registry", "ClientApp")
    PusherCredentials = apps.get_model("apps_registry", "PusherCredentials")
    for app in ClientApp.objects.filter(pusher__isnull=True):
        PusherCredentials.objects.create(app=app, pusher_app_id=new_pusher_app_id(), key=new_pusher_key(),
                                         secret=new_pusher_secret())


class Migration(migrations.Migration):

    dependencies = [
        ('apps_registry', '0015_takeover_per_standby'),
    ]

    operations = [
        migrations.CreateModel(
            name='PusherCredentials',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('pusher_app_id', models.CharField(default=apps_registry.pusher_credentials.new_pusher_app_id, max_length=64, unique=True, verbose_name='Pusher app_id')),
                ('key', models.CharField(default=apps_registry.pusher_credentials.new_pusher_key, max_length=64, unique=True, verbose_name='Pusher key')),
                ('secret', models.CharField(default=apps_registry.pusher_credentials.new_pusher_secret, max_length=128, verbose_name='Pusher secret')),
                ('client_events', models.BooleanField(default=False, help_text='Clients may send client-* events to the other subscribers of private and presence channels.', verbose_name='client events')),
                ('enabled', models.BooleanField(default=True, help_text='Off: Pusher clients are refused (close 4003) and the Pusher HTTP API answers 403.')),
                ('secret_rotated_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('app', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='pusher', to='apps_registry.clientapp')),
            ],
            options={
                'verbose_name': 'Pusher credentials',
                'verbose_name_plural': 'Pusher credentials',
                'ordering': ['app__app_name'],
            },
        ),
        migrations.RunPython(credentials_for_existing_apps, migrations.RunPython.noop),
    ]
