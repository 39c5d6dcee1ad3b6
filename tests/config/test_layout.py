from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_platform_folder_is_not_a_package_so_the_stdlib_platform_module_still_works():
    assert not (ROOT / "platform" / "__init__.py").exists()
    assert platform.system() == "Linux"
    assert Path(platform.__file__).parent != ROOT / "platform"


def test_config_package_is_importable_from_platform_folder():
    import config

    assert Path(config.__file__).parent == ROOT / "platform" / "config"


def test_manage_py_check_passes_from_a_fresh_interpreter():
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_every_model_change_has_a_migration():
    result = subprocess.run([sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_compose_describes_the_production_stack():
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(services)
    for role in ("web", "worker", "beat"):
        assert services[role]["build"]["dockerfile"] == "platform/Dockerfile"
        env = services[role]["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} <= set(env)
        assert env["DJANGO_SETTINGS_MODULE"] == "config.settings.production"
    assert "celery" in services["worker"]["command"] and "worker" in services["worker"]["command"]
    assert "beat" in services["beat"]["command"]
    assert (ROOT / "platform" / "Dockerfile").exists()
