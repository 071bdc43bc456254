"""The `<tool_call>` parser both engines use on the model's streamed text."""

import json

from inference.engine.base import ToolCallDelta
from inference.engine.tool_calls import ToolCallParser


def test_tool_calls_are_parsed_out_of_the_transcript():
    text = ('Sure, checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>\n<tool_call>\n{"name": "set_alarm", "arguments": "{\\"minutes\\": 5}"}'
            '\n</tool_call>\n<tool_call>\nnot json\n</tool_call> Done.')
    parser = ToolCallParser()
    items = []
    for char in text:  # one character at a time: tags arrive split
        items += parser.feed(char)
    items += parser.finish()
    transcript = "".join(i for i in items if isinstance(i, str))
    calls = [i for i in items if isinstance(i, ToolCallDelta)]
    assert transcript == "Sure, checking.Done."
    assert "<" not in transcript
    assert [c.name for c in calls] == ["get_weather", "set_alarm"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert json.loads(calls[1].arguments) == {"minutes": 5}
    assert len({c.call_id for c in calls}) == 2


def test_unterminated_tool_call_at_the_end_is_still_parsed():
    parser = ToolCallParser()
    items = parser.feed('<tool_call>\n{"name": "set_alarm", "arguments": {"minutes": 1}}')
    items += parser.finish()
    assert [(c.name, json.loads(c.arguments)) for c in items] == [("set_alarm", {"minutes": 1})]


def test_calls_cut_anywhere_are_found_and_text_kept():
    reply = 'Sure.<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "b"}</tool_call>'
    for cut in range(1, len(reply)):
        parser = ToolCallParser()
        pieces = parser.feed(reply[:cut]) + parser.feed(reply[cut:]) + parser.finish()
        assert "".join(p for p in pieces if isinstance(p, str)) == "Sure."
        calls = [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ToolCallDelta)]
        assert calls == [("a", {"x": 1}), ("b", {})]


def test_lookalike_text_is_spoken_and_malformed_calls_are_dropped():
    parser = ToolCallParser()
    pieces = parser.feed("a < b and <tool_call>{not json}</tool_call> <tool") + parser.finish()
    assert all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == "a < b and<tool"
