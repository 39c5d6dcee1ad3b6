"""The development machinery, apart from the product (docs/architecture.md, "Layers"):

- `embedded`: a self-contained Postgres and Redis under var/ for machines without DATABASE_URL /
  REDIS_URL (`pg_recovery`: starting one again after its postmaster was killed);
- `supervise`: `make run`, the whole platform as one supervised process group (`children`: the
  processes it starts and stops); with WEB_NODES > 1, HAProxy in front (`balancer`: its
  configuration) and `rolling`: `make restart-web`, the web nodes restarted one at a time;
- `sysdeps`: what the test suite (and HAProxy) need from the operating system;
- `pytest_services`: the test session's embedded services, started before Django reads its settings.

Nothing in the product imports it: `make run`, `manage.py` and the test session start the embedded
services here and hand their URLs over in DATABASE_URL and REDIS_URL. Production never runs it.
"""
