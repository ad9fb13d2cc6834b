"""JSON without the json package: the C accelerator's scanner and encoders (the plain module
where an interpreter lacks it), and what the host would refuse of JSON data before parsing
it (too deep, too many elements, a lone surrogate)."""

try:
    import _json
except ImportError:  # an interpreter without the C accelerator: the plain module will do
    _json = None  # type: ignore[assignment]


#: JSON nested deeper, or holding more elements, than this is refused before it is sent:
#: the host refuses such frames before it parses them. Copies of protocol/limits.py.
MAX_JSON_DEPTH = 128
MAX_JSON_ELEMENTS = 2**16


class _DecodeContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo = None

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not valid JSON")


def _not_serialisable(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


if _json is not None:
    _scan = _json.make_scanner(_DecodeContext())  # type: ignore[arg-type]

    def json_loads(text):
        if isinstance(text, (bytes, bytearray)):
            text = text.decode("utf-8")
        start = len(text) - len(text.lstrip(" \t\r\n"))
        end = len(text.rstrip(" \t\r\n"))
        try:
            value, stop = _scan(text, start)
        except StopIteration:
            raise ValueError("invalid JSON") from None
        if stop != end:
            raise ValueError("invalid JSON: extra data after the value")
        return value

    def json_dumps(value):
        encode = _json.make_encoder(
            {},
            _not_serialisable,
            _json.encode_basestring_ascii,
            None,
            ":",
            ",",
            False,
            False,
            False,
        )
        return "".join(encode(value, 0))

    def json_text(value):
        """Compact JSON with text left as text (sent as UTF-8): the form the host measures
        a call's arguments in."""
        encode = _json.make_encoder(
            {}, _not_serialisable, _json.encode_basestring, None, ":", ",", False, False, False
        )
        return "".join(encode(value, 0))

else:  # pragma: no cover - CPython always has _json

    def json_loads(text):
        import json

        return json.loads(text, parse_constant=_DecodeContext.parse_constant)

    def json_dumps(value):
        import json

        return json.dumps(value, allow_nan=False, separators=(",", ":"))

    def json_text(value):
        import json

        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


#: A tool's name as a JSON string: json_dumps of a str, without building an encoder per call.
_quoted = json_dumps if _json is None else _json.encode_basestring_ascii


def json_problem(value):
    """Why the host would refuse this (already encodable) JSON data, or None."""
    # Elements counted as the host counts them on the text (protocol/shape.py): a "[" and a
    # "," between items; a "{", a "," between members and a ":" in each.
    elements = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"it is nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "it contains a lone surrogate, which is not valid Unicode text"
        elif isinstance(item, dict):
            elements += 2 * len(item) or 1
            for key, member in item.items():
                stack.append((key, depth + 1))
                stack.append((member, depth + 1))
        elif isinstance(item, (list, tuple)):
            elements += len(item) or 1
            stack.extend((member, depth + 1) for member in item)
        if elements > MAX_JSON_ELEMENTS:
            return f"it holds more than {MAX_JSON_ELEMENTS} elements"
    return None
