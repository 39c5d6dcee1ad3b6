from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps_registry.models import ClientApp

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_logs_in_and_creates_a_client_app_in_a_real_browser(live_server, browser, tmp_path):
    User.objects.create_superuser("operator", password="correct-horse-battery")
    page = browser.new_page()

    page.goto(f"{live_server.url}/admin/apps_registry/clientapp/")
    assert "/admin/login/" in page.url  # anonymous: sent to the login page

    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct-horse-battery")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/apps_registry/clientapp/")

    page.goto(f"{live_server.url}/admin/apps_registry/clientapp/add/")
    page.fill("#id_app_name", "KIWI")
    page.fill("#id_app_id", "kiwi-app-001")
    page.fill("#id_master_user_id", "KIWI-1")
    page.click("input[name=_save]")
    page.wait_for_selector("text=was added successfully")
    page.screenshot(path=str(tmp_path / "admin-app-created.png"))

    assert page.locator("#result_list").inner_text().count("KIWI") >= 1
    app = ClientApp.objects.get(app_name="KIWI")
    assert (app.app_id, app.master_user_id) == ("kiwi-app-001", "KIWI-1")
