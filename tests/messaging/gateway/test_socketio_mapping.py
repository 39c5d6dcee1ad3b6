"""How Socket.IO events and /ws frames stand for each other (messaging.gateway.socketio.mapping), and the
signed pid a reconnecting socket.io-client brings back."""

from __future__ import annotations

import pytest

from messaging.core.protocol import FrameError, frame_of
from messaging.gateway.socketio.consumer import Packet, pid_for, pid_matches
from messaging.gateway.socketio.mapping import answer_of, event_of, frame_for_event, message_of


def test_a_message_event_becomes_the_message_frame_with_its_feature_and_reference_beside_the_data():
    raw = frame_for_event("message", {"to": "ANZ-1", "content": "hi", "feature": "FAST", "reference": "r-7",
                                      "clientMessageId": "c-1"})
    frame = frame_of(raw)
    assert (frame.type, frame.feature, frame.reference) == ("MESSAGE", "FAST", "r-7")
    assert frame.data == {"to": "ANZ-1", "content": "hi", "clientMessageId": "c-1"}


def test_each_client_event_names_its_frame_and_an_unknown_one_is_refused_by_name():
    assert frame_for_event("fetch_missing", {"count": 5}) == {"type": "FETCH_MISSING_MESSAGES_REQUEST",
                                                              "data": {"count": 5}}
    assert frame_for_event("group_message", {"to": ["ANZ-1"], "content": "x"})["type"] == "GROUP_MESSAGE"
    assert frame_for_event("subscribe", {"channel": "news"})["type"] == "SUBSCRIBE"
    with pytest.raises(FrameError, match="unknown event 'shout'"):
        frame_for_event("shout", {})


def test_a_stored_message_carries_its_id_and_seq_and_a_fast_one_neither():
    stored = message_of("MESSAGE", {"from": "ANZ-2", "content": "c", "id": "9", "seq": 3}, "ref")
    assert stored == {"id": "9", "from": "ANZ-2", "content": "c", "seq": 3, "feature": "RELIABLE", "reference": "ref"}
    fast = message_of("MESSAGE", {"from": "ANZ-2", "content": "c"}, None)
    assert fast["feature"] == "FAST" and fast["id"] is None and "reference" not in fast
    assert message_of("MESSAGE_CONFIRMATION", {"reference": "r", "id": "4", "seq": 1}, None) == {"reference": "r",
                                                                                               "id": "4"}


def test_answers_are_the_result_or_an_error_with_its_code_and_detail():
    assert answer_of("MESSAGE_ACCEPTED", {"id": "5", "recipients": 1, "duplicate": True}, None) == {
        "id": "5", "duplicate": True}
    assert answer_of("INVALID_MESSAGE", {"reason": "too fast", "retryAfterMs": 20, "data": {}}, None) == {
        "error": "INVALID_MESSAGE", "detail": "too fast", "retryAfterMs": 20}
    assert answer_of("GENERAL_ERROR", {}, None)["error"] == "GENERAL_ERROR"
    assert answer_of("FETCH_MISSING_MESSAGES_COMPLETE", {"leftMissingCount": 2}, [{"id": "1"}]) == {
        "messages": [{"id": "1"}], "leftMissingCount": 2}
    assert answer_of("SUBSCRIBED", {"channel": "news", "offset": 4}, None) == {"channel": "news", "offset": 4}
    assert answer_of("CHANNEL_MESSAGE", {}, None) is None  # a push, not an answer


def test_pushed_frames_are_events_and_pong_is_nothing():
    assert event_of("CHANNEL_MESSAGE", {"channel": "news", "content": "x", "offset": 2}) == (
        "channel_message", {"channel": "news", "offset": 2, "message": "x"})
    assert event_of("USER_CONNECTED", {"userId": "ANZ-1"}) == ("user_connected", {"userId": "ANZ-1"})
    assert event_of("EVENT", {"seq": 1, "kind": "B", "from": None, "to": None})[0] == "event"
    assert event_of("PONG", {}) is None


def test_a_socketio_packet_with_nan_is_not_json_and_is_refused():
    with pytest.raises(ValueError):
        Packet(encoded_packet='2["message",{"count":NaN}]')
    assert Packet(encoded_packet='21["message",{"count":1}]').data == ["message", {"count": 1}]


def test_a_pid_is_recognised_only_for_the_app_and_user_it_was_given_to():
    pid = pid_for("app-id-343", "ANZ-1")
    assert pid_matches(pid, "app-id-343", "ANZ-1")
    assert not pid_matches(pid, "app-id-343", "ANZ-2")
    assert not pid_matches(pid[:-2] + "xx", "app-id-343", "ANZ-1")
    assert not pid_matches(None, "app-id-343", "ANZ-1")


def test_a_pid_brings_back_the_resumable_session_it_was_given_with():
    from messaging.gateway.socketio.consumer import pid_session

    assert pid_session(pid_for("app-id-343", "ANZ-1", "sAbc.def"), "app-id-343", "ANZ-1") == "sAbc.def"
    assert pid_session(pid_for("app-id-343", "ANZ-1"), "app-id-343", "ANZ-1") == ""
    assert pid_session(pid_for("app-id-343", "ANZ-1", "sAbc.def"), "app-id-343", "ANZ-2") is None


def test_a_server_requests_callback_stands_for_a_resolve_or_a_reject_and_nothing_else():
    from messaging.gateway.socketio.mapping import answer_frame

    assert answer_frame("7", [{"resolve": "yes"}]) == {"type": "RESOLVE", "data": {"requestId": "7", "content": "yes"}}
    assert answer_frame("7", [{"reject": {"why": 1}}])["data"]["content"] == '{"why":1}'
    assert answer_frame("7", [{"resolve": 1, "reject": 2}]) is None
    assert answer_frame("7", [{}]) is None and answer_frame("7", None) is None


def test_a_plain_event_is_read_with_its_ack_id_and_anything_else_is_left_to_the_full_parser():
    from messaging.gateway.socketio.mapping import MALFORMED, event_text, plain_event

    assert plain_event('2["message",{"to":"ANZ-1"}]') == (["message", {"to": "ANZ-1"}], None)
    assert plain_event('217["fetch_missing",{"count":3}]') == (["fetch_missing", {"count": 3}], 17)
    assert plain_event('2/admin,["x"]') is None  # another namespace
    assert plain_event('51-["message",{"_placeholder":true,"num":0}]') is None  # attachments
    assert plain_event("0{}") is None
    assert plain_event('2["message",NaN]') is MALFORMED
    assert event_text("message", {"a": 1}, 4) == '24["message",{"a":1}]'
    assert plain_event(event_text("x", [1, "é"])) == (["x", [1, "é"]], None)


def test_a_request_event_is_the_request_frame_answered_with_its_id_and_its_outcome_is_an_event_of_its_own():
    raw = frame_for_event("request", {"endpoint": "orders.place", "content": "x", "clientMessageId": "r-1",
                                      "timeoutMs": 500})
    assert raw == {"type": "REQUEST", "data": {"endpoint": "orders.place", "content": "x", "clientMessageId": "r-1",
                                               "timeoutMs": 500}}
    assert answer_of("REQUEST_ACCEPTED", {"id": "311", "clientMessageId": "r-1", "duplicate": True}, None) == {
        "id": "311", "clientMessageId": "r-1", "duplicate": True}
    assert answer_of("INVALID_MESSAGE", {"reason": "unknown endpoint", "code": "unknown_endpoint", "data": {}},
                     None) == {"error": "INVALID_MESSAGE", "detail": "unknown endpoint", "code": "unknown_endpoint"}
    outcome = {"id": "8812", "requestId": "311", "clientMessageId": "r-1", "content": "done", "seq": 4,
               "reason": "timeout"}
    assert message_of("REJECT", outcome, None) == outcome
