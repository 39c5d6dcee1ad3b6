from __future__ import annotations

import json

import pytest

from config.transport.frames import encode
from messaging.protocol import FrameError, delivery_frame, invalid, parse_frame


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
