from __future__ import annotations

from django.db import migrations

# Overlap check inside the database. The row lock on the app serialises concurrent writers of
# the same app's distributions, so the check-then-insert cannot race.
FORWARD = """
CREATE OR REPLACE FUNCTION apps_registry_distribution_no_overlap() RETURNS trigger AS $$
DECLARE clash record;
BEGIN
    PERFORM 1 FROM apps_registry_clientapp WHERE id = NEW.app_id FOR UPDATE;
    SELECT d.id, d.range_from, d.range_to INTO clash
      FROM apps_registry_userdistribution d
     WHERE d.app_id = NEW.app_id
       AND d.id <> COALESCE(NEW.id, -1)
       AND int8range(d.range_from, d.range_to, '[]') && int8range(NEW.range_from, NEW.range_to, '[]')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'user distribution % overlaps distribution % (% to %)',
            int8range(NEW.range_from, NEW.range_to, '[]'), clash.id, clash.range_from, COALESCE(clash.range_to::text, 'no end')
            USING ERRCODE = 'exclusion_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER apps_registry_distribution_no_overlap
BEFORE INSERT OR UPDATE ON apps_registry_userdistribution
FOR EACH ROW EXECUTE FUNCTION apps_registry_distribution_no_overlap();
"""

REVERSE = """
DROP TRIGGER IF EXISTS apps_registry_distribution_no_overlap ON apps_registry_userdistribution;
DROP FUNCTION IF EXISTS apps_registry_distribution_no_overlap();
"""


class Migration(migrations.Migration):
    dependencies = [("apps_registry", "0001_initial")]
    operations = [migrations.RunSQL(FORWARD, REVERSE)]
