from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.system]


def _open_client(browser, web, user_id: str):
    page = browser.new_page()
    page.goto(f"{web.url}/demo/?user={user_id}")
    page.click("#connect")
    page.wait_for_selector("text=connected")
    page.click("#auth")
    page.wait_for_selector(f"#status:has-text('authenticated as {user_id}')")
    return page


def test_two_pages_exchange_a_message_and_the_sender_sees_its_confirmation(browser, node, tmp_path):
    alice = _open_client(browser, node, "ANZ-50001")
    bob = _open_client(browser, node, "ANZ-50002")

    alice.fill("#to", "ANZ-50002")
    alice.fill("#content", "hello from a real browser")
    alice.fill("#reference", "demo-1")
    alice.click("#send")

    bob.wait_for_selector("#log .in:has-text('hello from a real browser')")
    alice.wait_for_selector("#log .in:has-text('MESSAGE_CONFIRMATION')")
    assert '"reference":"demo-1"' in alice.locator("#log .in", has_text="MESSAGE_CONFIRMATION").inner_text()
    assert "→" in alice.locator("#log .out").first.inner_text()  # frames out are shown too
    alice.screenshot(path=str(tmp_path / "demo-alice.png"))
