from __future__ import annotations

import json

import pytest

from foundation.transport.frames import encode
from messaging.core.protocol import FrameError, delivery_frame, invalid, parse_frame


def test_a_linker_message_frame_parses_with_its_defaults():
    frame = parse_frame(json.dumps({"type": "MESSAGE", "data": {"to": "ANZ-1", "content": "x"}, "reference": "abc"}))
    assert (frame.type, frame.feature, frame.reference, frame.confirmation_enabled) == ("MESSAGE", "RELIABLE", "abc", True)


def test_confirmation_can_be_declined_per_message():
    assert parse_frame('{"type":"MESSAGE","data":{},"confirmationEnabled":false}').confirmation_enabled is False


@pytest.mark.parametrize("text", ["", "nope", "[]", "{}", '{"type":"X"}', '{"type":"MESSAGE","feature":"SLOW"}'])
def test_bad_frames_raise_frame_errors_not_exceptions(text):
    with pytest.raises(FrameError):
        parse_frame(text)


def test_server_frames_omit_absent_fields():
    assert json.loads(encode("AUTH_REQUIRED", {})) == {"type": "AUTH_REQUIRED", "data": {}}
    assert "reference" not in json.loads(encode("MESSAGE", {"from": "a"}, None))
    assert json.loads(invalid("malformed JSON")) == {"type": "INVALID_MESSAGE", "data": {"reason": "malformed JSON"}}


def test_stored_messages_carry_id_and_seq_and_confirmations_their_reference():
    message = json.loads(delivery_frame(kind="direct", sender="ANZ-1", content="hi", reference="r", message_id=7, seq=3))
    assert message == {"type": "MESSAGE", "data": {"from": "ANZ-1", "content": "hi", "id": "7", "seq": 3}, "reference": "r"}
    confirmation = json.loads(delivery_frame(kind="confirmation", sender="ANZ-2", content="", reference="r",
                                             message_id=8, seq=1))
    assert confirmation["type"] == "MESSAGE_CONFIRMATION" and confirmation["data"]["reference"] == "r"


@pytest.mark.parametrize("text, reason", [
    ('{"type":"MESSAGE","data":{"to":"ANZ-1","content":NaN}}', "malformed JSON"),
    ('{"type":"ACK","data":{"ids":[Infinity]}}', "malformed JSON"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-1","content":"\\udc00"}}', "lone surrogate"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-1\\ud800","content":"x"}}', "lone surrogate"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-1","content":"a\\u0000b"}}', "NUL"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-1","content":"x"},"reference":"r\\u0000"}', "NUL"),
])
def test_frames_no_socket_or_database_can_carry_are_refused_without_echoing_them(text, reason):
    with pytest.raises(FrameError) as refused:
        parse_frame(text)
    assert reason in refused.value.reason and refused.value.data is None


def test_escaped_text_that_is_valid_unicode_is_taken():
    frame = parse_frame('{"type":"MESSAGE","data":{"to":"ANZ-1","content":"smile \\ud83d\\ude00 \\u00e9 \\\\u0000"}}')
    assert frame.data["content"] == "smile \U0001F600 é \\u0000"


def test_server_frames_are_strict_json():
    with pytest.raises(ValueError):
        encode("MESSAGE", {"content": float("nan")})


@pytest.mark.parametrize("ids, expected", [(["7", 8], [7, 8]), (["9223372036854775807"], None), ([True], None),
                                           (["1e3"], None), (["١٢"], None), ([], None), (["1"] * 2001, None)])
def test_ack_ids_are_server_message_ids_within_bounds(ids, expected):
    from messaging.core.protocol import message_ids

    if expected is None:
        with pytest.raises(FrameError):
            message_ids(ids, {})
    else:
        assert message_ids(ids, {}) == expected


def test_a_reference_longer_than_the_limit_is_refused_not_cut():
    with pytest.raises(FrameError, match="at most 256"):
        parse_frame(json.dumps({"type": "MESSAGE", "data": {}, "reference": "r" * 257}))
