from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from mado.validation import has_nul


class StrictJSONParser(JSONParser):
    """JSON bodies without NUL characters: they cannot be stored, so they are refused up front."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if has_nul(data):
            raise ParseError("Remove the NUL characters (\\u0000) from the request body.")
        return data
