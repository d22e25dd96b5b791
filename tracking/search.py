"""MLflow's search syntax for runs: filter strings (`metrics.acc > 0.9 and params.lr = '0.01' and
tags.team LIKE 'vision%' and attributes.status = 'FINISHED'`) and order_by clauses, turned into Django
queries. The grammar is MLflow's (mlflow.utils.search_utils.SearchUtils) for the entities runs have."""
from __future__ import annotations

import math
import re

from django.db.models import Exists, F, FloatField, OuterRef, Q, Subquery
from django.db.models.functions import Cast
from django.db.models.lookups import Exact, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual

from tracking.errors import invalid
from tracking.models import LatestMetric, Param, Tag
from tracking.validation import INT64_MAX, INT64_MIN

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*")
    | (?P<backtick>`[^`]*`)
    | (?P<op>!=|<>|<=|>=|=|<|>)
    | (?P<lparen>\()
    | (?P<rparen>\))
    | (?P<comma>,)
    | (?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))(?![\w.])
    | (?P<word>[\w.:/\-]+)
    )""", re.VERBOSE)

METRIC = ("metric", "metrics")
PARAM = ("param", "params", "parameter", "parameters")
TAG = ("tag", "tags")
ATTRIBUTE = ("attribute", "attributes", "attr", "run")
ATTRIBUTES = {"run_id": "run_id", "run_name": "name", "status": "status", "start_time": "start_time",
              "end_time": "end_time", "user_id": "created_by__username", "artifact_uri": None,
              "lifecycle_stage": "lifecycle_stage", "created": "start_time", "run name": "name"}
NUMERIC_ATTRIBUTES = {"start_time", "end_time", "created"}
STRING_OPS = {"=", "!=", "LIKE", "ILIKE", "IN", "NOT IN"}
NUMERIC_OPS = {"=", "!=", "<", "<=", ">", ">="}


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            raise invalid(f"Invalid filter string '{text}': could not parse it at position {position} "
                          f"('{text[position:position + 20]}').")
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


def unquote(value: str) -> str:
    if value[:1] in "'\"`" and value[-1:] == value[:1] and len(value) >= 2:
        inner = value[1:-1]
        return inner.replace("''", "'") if value[0] == "'" else inner
    return value


def split_identifier(tokens: list, index: int, text: str) -> tuple[str, str, int]:
    """`metrics.acc`, `params."a b"`, tags.<backticked key>, or a bare attribute; returns (entity, key, next)."""
    kind, value = tokens[index]
    if kind == "word" and "." in value:
        entity, _dot, key = value.partition(".")
        if key == "" and index + 1 < len(tokens) and tokens[index + 1][0] in ("string", "backtick"):
            return entity.lower(), unquote(tokens[index + 1][1]), index + 2
        if key:
            return entity.lower(), key, index + 1
    if kind == "word":
        return "attribute", value, index + 1
    raise invalid(f"Invalid filter string '{text}': expected an identifier such as metrics.acc, got '{value}'.")


def parse_filter(text: str | None) -> Q:
    if not text or not str(text).strip():
        return Q()
    text = str(text)
    tokens = tokenize(text)
    query, index = Q(), 0
    while index < len(tokens):
        entity, key, index = split_identifier(tokens, index, text)
        if index >= len(tokens):
            raise invalid(f"Invalid filter string '{text}': a comparison is missing after '{entity}.{key}'.")
        kind, value = tokens[index]
        op = value.upper() if kind in ("op", "word") else ""
        if op == "<>":
            op = "!="
        if op == "NOT" and index + 1 < len(tokens) and tokens[index + 1][1].upper() == "IN":
            op, index = "NOT IN", index + 1
        elif op == "IS":
            if index + 1 < len(tokens) and tokens[index + 1][1].upper() == "NOT":
                op, index = "IS NOT NULL", index + 2
            else:
                op, index = "IS NULL", index + 1
            if index >= len(tokens) or tokens[index][1].upper() != "NULL":
                raise invalid(f"Invalid filter string '{text}': IS must be followed by NULL or NOT NULL.")
        elif op not in NUMERIC_OPS | STRING_OPS:
            raise invalid(f"Invalid comparator '{value}' in filter string '{text}'.")
        index += 1
        if op in ("IS NULL", "IS NOT NULL"):
            operand = None
        elif op in ("IN", "NOT IN"):
            operand, index = parse_list(tokens, index, text)
        else:
            if index >= len(tokens):
                raise invalid(f"Invalid filter string '{text}': a value is missing after '{op}'.")
            operand = tokens[index]
            index += 1
        query &= _clause(entity, key, op, operand, text)
        if index < len(tokens):
            if tokens[index][1].upper() != "AND":
                raise invalid(f"Invalid filter string '{text}': clauses are joined with AND "
                              f"(got '{tokens[index][1]}').")
            index += 1
            if index >= len(tokens):
                raise invalid(f"Invalid filter string '{text}': a clause is missing after AND.")
    return query


def parse_list(tokens, index, text) -> tuple[list[str], int]:
    if index >= len(tokens) or tokens[index][0] != "lparen":
        raise invalid(f"Invalid filter string '{text}': IN takes a list of quoted strings, as ('a', 'b').")
    values, index = [], index + 1
    while index < len(tokens) and tokens[index][0] != "rparen":
        kind, value = tokens[index]
        if kind == "comma":
            index += 1
            continue
        if kind != "string":
            raise invalid(f"Invalid filter string '{text}': IN takes a list of quoted strings.")
        values.append(unquote(value))
        index += 1
    if index >= len(tokens):
        raise invalid(f"Invalid filter string '{text}': the list after IN is not closed.")
    return values, index + 1


def like_regex(pattern: str) -> str:
    out = []
    for char in pattern:
        out.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
    return "^" + "".join(out) + "$"


def string_q(field: str, op: str, operand) -> Q:
    if op in ("IN", "NOT IN"):
        q = Q(**{f"{field}__in": operand})
        return ~q if op == "NOT IN" else q
    kind, raw = operand
    if kind not in ("string", "number", "word"):
        raise invalid(f"Invalid value {raw} in a filter: expected a quoted string.")
    value = unquote(raw)
    if op == "=":
        return Q(**{field: value})
    if op == "!=":
        return ~Q(**{field: value})
    if op == "LIKE":
        return Q(**{f"{field}__regex": like_regex(value)})
    if op == "ILIKE":
        return Q(**{f"{field}__iregex": like_regex(value)})
    raise invalid(f"Invalid comparator '{op}' for a string; use one of =, !=, LIKE, ILIKE, IN, NOT IN.")


def _number(operand, text: str) -> float:
    kind, raw = operand
    try:
        if kind != "number":
            raise ValueError
        return float(raw)
    except ValueError:
        raise invalid(f"Expected numeric value type for metric or numeric attribute, got '{raw}' in "
                      f"filter string '{text}'.") from None


_NUMERIC_LOOKUP = {"=": "", "<": "__lt", "<=": "__lte", ">": "__gt", ">=": "__gte"}


def _numeric_q(field: str, op: str, value: float) -> Q:
    if op == "!=":
        return ~Q(**{field: value})
    if op not in _NUMERIC_LOOKUP:
        raise invalid(f"Invalid comparator '{op}' for a number; use one of =, !=, <, <=, >, >=.")
    return Q(**{f"{field}{_NUMERIC_LOOKUP[op]}": value})


def _whole_q(field: str, op: str, value: float, text: str) -> Q:
    """A comparison on a bigint column (start_time, end_time) with any finite number: whole numbers within
    int64 compare as they are; others compare with the column as a double, so 1e23 or 1.5 cannot overflow."""
    if not math.isfinite(value):
        raise invalid(f"Expected a finite number in filter string '{text}'.")
    if value.is_integer() and INT64_MIN <= value <= INT64_MAX:
        return _numeric_q(field, op, int(value))
    alias = Cast(field, FloatField())
    if op == "!=":
        return ~Q(Exact(alias, value))
    lookup = {"=": Exact, "<": LessThan, "<=": LessThanOrEqual, ">": GreaterThan, ">=": GreaterThanOrEqual}[op]
    return Q(lookup(alias, value))


def _clause(entity: str, key: str, op: str, operand, text: str) -> Q:
    key = unquote(key)
    if entity in METRIC:
        if op not in NUMERIC_OPS:
            raise invalid(f"Invalid comparator '{op}' for metrics; use one of =, !=, <, <=, >, >=.")
        rows = LatestMetric.objects.filter(run=OuterRef("pk"), key=key).filter(
            _numeric_q("value", op, _number(operand, text)))
        return Q(Exists(rows))
    if entity in PARAM or entity in TAG:
        model = Param if entity in PARAM else Tag
        if op in ("IS NULL", "IS NOT NULL"):
            present = Q(Exists(model.objects.filter(run=OuterRef("pk"), key=key)))
            return ~present if op == "IS NULL" else present
        if op not in STRING_OPS:
            raise invalid(f"Invalid comparator '{op}' for {entity}; use one of =, !=, LIKE, ILIKE, IN, NOT IN.")
        if op in ("!=", "NOT IN"):
            positive = "=" if op == "!=" else "IN"
            rows = model.objects.filter(run=OuterRef("pk"), key=key).exclude(string_q("value", positive, operand))
        else:
            rows = model.objects.filter(run=OuterRef("pk"), key=key).filter(string_q("value", op, operand))
        return Q(Exists(rows))
    if entity in ATTRIBUTE:
        name = key.lower()
        if name not in ATTRIBUTES or ATTRIBUTES[name] is None:
            raise invalid(f"Invalid attribute key '{key}' specified. Valid keys are "
                          f"{sorted(k for k, v in ATTRIBUTES.items() if v)}")
        field = ATTRIBUTES[name]
        if name in NUMERIC_ATTRIBUTES:
            if op in ("IS NULL", "IS NOT NULL"):
                return Q(**{f"{field}__isnull": op == "IS NULL"})
            if op not in NUMERIC_OPS:
                raise invalid(f"Invalid comparator '{op}' for attribute {key}; use one of =, !=, <, <=, >, >=.")
            return _whole_q(field, op, _number(operand, text), text)
        if op not in STRING_OPS:
            raise invalid(f"Invalid comparator '{op}' for attribute {key}; use one of =, !=, LIKE, ILIKE, IN, "
                          "NOT IN.")
        return string_q(field, op, operand)
    raise invalid(f"Invalid entity type '{entity}'. Valid values are ['metric', 'parameter', 'tag', 'attribute'].")


_ORDER = re.compile(r"^\s*(?P<ident>.+?)(?:\s+(?P<dir>ASC|DESC))?\s*$", re.IGNORECASE)


def order_fields(order_by) -> tuple[dict, list]:
    """(annotations, order expressions) for MLflow's order_by list; start_time DESC, run_id ASC after."""
    annotations, ordering = {}, []
    for index, clause in enumerate(order_by or []):
        if not isinstance(clause, str):
            raise invalid(f"Invalid order_by clause '{clause}'.")
        match = _ORDER.match(clause)
        if not match:
            raise invalid(f"Invalid order_by clause '{clause}'.")
        tokens = tokenize(match["ident"])
        entity, key, used = split_identifier(tokens, 0, clause)
        if used != len(tokens):
            raise invalid(f"Invalid order_by clause '{clause}'.")
        key = unquote(key)
        descending = (match["dir"] or "ASC").upper() == "DESC"
        if entity in METRIC or entity in PARAM or entity in TAG:
            model = LatestMetric if entity in METRIC else Param if entity in PARAM else Tag
            name = f"_order_{index}"
            annotations[name] = Subquery(model.objects.filter(run=OuterRef("pk"), key=key).values("value")[:1])
            expression = F(name)
        elif entity in ATTRIBUTE and ATTRIBUTES.get(key.lower()):
            expression = F(ATTRIBUTES[key.lower()])
        else:
            raise invalid(f"Invalid order_by clause '{clause}': order by metrics.<key>, params.<key>, tags.<key> "
                          "or an attribute (start_time, end_time, run_name, status, run_id).")
        ordering.append(expression.desc(nulls_last=True) if descending else expression.asc(nulls_last=True))
    ordering += [F("start_time").desc(nulls_last=True), F("run_id").asc()]
    return annotations, ordering
