from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils import json

from mado.validation import JsonRefused, loads_storable


class StrictJSONParser(JSONParser):
    """JSON bodies that can be stored and answered (mado.validation.loads_storable: finite numbers, at
    most 64 levels of nesting, no NUL characters, no lone surrogates), or a 400 saying what to fix, so
    no endpoint ever sees the rest."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})
        try:
            return loads_storable(stream.read().decode(encoding),
                                  parse_constant=json.strict_constant if self.strict else None)
        except JsonRefused as refused:
            raise ParseError(refused.message, code=refused.code) from None
        except ValueError as exc:  # not JSON, or not in the request's charset
            raise ParseError(f"JSON parse error - {exc}") from None
