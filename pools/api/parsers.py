"""Request body parsers of the whole API: what no endpoint should ever have to check itself.

PostgreSQL refuses NUL (U+0000) in text and jsonb, so a NUL that reached a query was a 500;
deep nesting made json.loads raise RecursionError (a 500 too) and costs every later walk over
the data. Both are refused here with a 400 ParseError, for every endpoint at once.
"""

import re

from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_JSON_DEPTH = 64  # far above any body the API accepts (a resource request is 3 deep)
TOO_DEEP = f"The body is nested too deep (more than {MAX_JSON_DEPTH} levels)."

# NUL, and lone surrogates (JSON's "\ud800" decodes to one; PostgreSQL cannot store it either)
REFUSED_CHARACTERS = re.compile("[\x00\ud800-\udfff]")
REFUSED = "Strings must not contain NUL characters (\\u0000) or lone surrogates."


def check_parsed(data):
    """Refuse NUL or a lone surrogate in any string or key, and nesting deeper than
    MAX_JSON_DEPTH. Iterative, so that the check itself has no recursion limit."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if REFUSED_CHARACTERS.search(value):
                raise ParseError(REFUSED)
        elif isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ParseError(TOO_DEEP)
            if isinstance(value, dict):
                stack.extend((key, depth) for key in value)
                value = value.values()
            stack.extend((item, depth + 1) for item in value)


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # json.loads gives up on nesting far beyond MAX_JSON_DEPTH
            raise ParseError(TOO_DEEP) from None
        check_parsed(data)
        return data


def replace_refused(data):
    """`data` with NUL and lone surrogates in its strings replaced by U+FFFD (iterative)."""

    def clean(value):
        return REFUSED_CHARACTERS.sub("\ufffd", value) if isinstance(value, str) else value

    root = [clean(data)]
    stack = [(root, 0)]
    while stack:
        holder, key = stack.pop()
        value = holder[key]
        if isinstance(value, dict):
            value = holder[key] = {clean(k): clean(v) for k, v in value.items()}
            stack.extend((value, k) for k in value)
        elif isinstance(value, list):
            value[:] = [clean(item) for item in value]
            stack.extend((value, index) for index in range(len(value)))
    return root[0]


class TextJSONParser(JSONParser):
    """For a body that carries what a program printed (the agent's log chunks): NUL and lone
    surrogates become U+FFFD instead of refusing the body, so one stray byte never drops the
    lines around it. The depth limit still holds."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = parsers.JSONParser.parse(self, stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(TOO_DEEP) from None
        data = replace_refused(data)
        check_parsed(data)
        return data


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        check_parsed(dict(data.lists()))
        return data


class MultiPartParser(parsers.MultiPartParser):
    """Field values only: an uploaded file may hold any bytes."""

    def parse(self, stream, media_type=None, parser_context=None):
        parsed = super().parse(stream, media_type, parser_context)
        check_parsed(dict(parsed.data.lists()))
        return parsed
