"""JSON schemas for the structured-output tests and benchmarks: typical schemas (as Pydantic writes them) with a
valid instance each, and single JSON-schema features with a valid and an invalid instance.

Shared by tests/engine/test_structured*.py, benchmarks/grammar_compile.py (the library choice) and
benchmarks/structured_decode.py.
"""

from __future__ import annotations

_ITEM = {"type": "object", "title": "Item", "additionalProperties": False, "required": ["sku", "qty", "price"],
         "properties": {"sku": {"type": "string", "maxLength": 12, "title": "Sku"},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 99, "title": "Qty"},
                        "price": {"type": "number", "minimum": 0, "title": "Price"}}}


def _object(required: list[str], **properties) -> dict:
    return {"type": "object", "additionalProperties": False, "required": required, "properties": properties}


def _str(max_length: int, **more) -> dict:
    return {"type": "string", "maxLength": max_length, **more}


def _array(items: dict, max_items: int, **more) -> dict:
    return {"type": "array", "items": items, "maxItems": max_items, **more}


_NODE = _object(["value", "children"], value={"type": "integer"},
                children={"type": "array", "items": {"$ref": "#/$defs/Node"}})

# name -> (schema, a valid instance, its keys in the schema's order: the order the grammar writes them in);
# None: json_object (any JSON object)
TYPICAL: dict[str, tuple[dict | None, object]] = {
    "person": (_object(["name", "age"], name=_str(40), age={"type": "integer", "minimum": 0, "maximum": 150},
                       email={"anyOf": [_str(60), {"type": "null"}], "default": None}),
               {"name": "Ada Lovelace", "age": 36, "email": None}),
    "address": (_object(["name", "address", "tags"], name=_str(40),
                        address=_object(["street", "city", "zip"], street=_str(40), city=_str(30),
                                        zip={"type": "string", "pattern": "^[0-9]{5}$"}),
                        tags=_array(_str(20), 4)),
                {"name": "Home", "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"},
                 "tags": ["a", "b"]}),
    "order": ({**_object(["id", "items", "status"], id={"type": "integer", "minimum": 1, "maximum": 10**6},
                         items=_array({"$ref": "#/$defs/Item"}, 3, minItems=1),
                         status={"enum": ["pending", "paid", "shipped", "cancelled"]}), "$defs": {"Item": _ITEM}},
              {"id": 7, "items": [{"sku": "A-1", "qty": 2, "price": 9.5}], "status": "paid"}),
    "sentiment": (_object(["sentiment", "confidence"],
                          sentiment={"type": "string", "enum": ["positive", "negative", "neutral"]},
                          confidence={"type": "number", "minimum": 0, "maximum": 1},
                          reason={"anyOf": [_str(100), {"type": "null"}]}),
                  {"sentiment": "neutral", "confidence": 0.5, "reason": "mixed"}),
    "weather": (_object(["city", "celsius", "humidity", "wind"], city=_str(40, minLength=1),
                        celsius={"type": "number", "exclusiveMinimum": -273.15, "maximum": 100},
                        humidity={"type": "integer", "minimum": 0, "maximum": 100},
                        wind=_array({"type": "number"}, 2, minItems=2)),
                {"city": "Oslo", "celsius": -3.5, "humidity": 80, "wind": [3.2, 270]}),
    "event": (_object(["title", "date", "attendees", "online"], title=_str(60),
                      date={"type": "string", "format": "date"}, attendees=_array(_str(30), 4),
                      online={"type": "boolean"},
                      room={"anyOf": [_object(["floor", "name"],
                                              floor={"type": "integer", "minimum": -5, "maximum": 200},
                                              name=_str(30)),
                                      {"type": "null"}]}),
              {"title": "Standup", "date": "2025-01-31", "attendees": ["Ann", "Bo"], "online": True,
               "room": {"floor": 3, "name": "Blue"}}),
    "quiz": (_object(["answer", "kind", "scores"], answer={"type": "boolean"}, kind={"const": "quiz"},
                     scores=_array({"type": "number"}, 5), level={"type": "string", "enum": ["easy", "hard"]}),
             {"answer": False, "kind": "quiz", "scores": [1, 2.5], "level": "hard"}),
    "user_list": (_object(["users"], users=_array(_object(["id", "role"],
                                                          id={"type": "integer", "minimum": 1, "maximum": 9999},
                                                          role={"enum": ["admin", "member", "guest"]},
                                                          nick=_str(20)), 4)),
                  {"users": [{"id": 1, "role": "admin"}, {"id": 2, "role": "guest", "nick": "g"}]}),
    "book": (_object(["title", "year", "genres", "isbn"], title=_str(60, minLength=1),
                     year={"type": "integer", "minimum": 1450, "maximum": 2100},
                     genres=_array({"enum": ["fiction", "science", "history", "poetry"]}, 3),
                     isbn={"type": "string", "pattern": "^97[89][0-9]{10}$"},
                     rating={"type": "number", "minimum": 0, "maximum": 5}),
             {"title": "Dune", "year": 1965, "genres": ["fiction"], "isbn": "9780441013593", "rating": 4.5}),
    "movie": (_object(["title", "director", "cast"], title=_str(60), director=_object(["name"], name=_str(40)),
                      cast=_array(_object(["actor", "lead"], actor=_str(40), lead={"type": "boolean"}), 3),
                      minutes={"type": "integer", "exclusiveMinimum": 0, "maximum": 600}),
              {"title": "Up", "director": {"name": "Pete Docter"}, "cast": [{"actor": "Ed Asner", "lead": True}],
               "minutes": 96}),
    "tree": ({"$ref": "#/$defs/Node", "$defs": {"Node": _NODE}},
             {"value": 1, "children": [{"value": 2, "children": []}]}),
    "json_object": (None, {"any": [1, "two", {"three": None}], "ok": True}),
}

# the schemas whose every document is bounded (strings, arrays, no recursion): a decode ends within max_tokens
BOUNDED = [name for name in TYPICAL if name not in ("tree", "json_object")]


def _obj(prop: dict) -> dict:
    return {"type": "object", "properties": {"v": prop}, "required": ["v"], "additionalProperties": False}


# feature -> (schema, valid value of "v", invalid value of "v")
FEATURES: dict[str, tuple[dict, object, object]] = {
    "minimum/maximum": (_obj({"type": "integer", "minimum": 1, "maximum": 9}), 5, 12),
    "exclusiveMinimum (number)": (_obj({"type": "number", "exclusiveMinimum": 0}), 0.5, -1),
    "multipleOf": (_obj({"type": "integer", "multipleOf": 5}), 15, 7),
    "minLength/maxLength": (_obj({"type": "string", "minLength": 2, "maxLength": 4}), "abc", "abcdefg"),
    "pattern": (_obj({"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"}), "AB-12", "ab-12"),
    "pattern+maxLength": (_obj({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}), "abc", "abcdef"),
    "format: date": (_obj({"type": "string", "format": "date"}), "2024-02-29", "yesterday"),
    "format: email": (_obj({"type": "string", "format": "email"}), "a@b.co", "not an email"),
    "format: uuid": (_obj({"type": "string", "format": "uuid"}), "123e4567-e89b-12d3-a456-426614174000", "x"),
    "enum": (_obj({"enum": ["red", "green"]}), "red", "blue"),
    "const": (_obj({"const": 42}), 42, 41),
    "minItems/maxItems": (_obj({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}),
                          [1], [1, 2, 3]),
    "uniqueItems": (_obj({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}), [1, 2], [1, 1]),
    "prefixItems": (_obj({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                          "items": False}), ["a", 1], [1, "a"]),
    "anyOf": (_obj({"anyOf": [{"type": "integer"}, {"type": "null"}]}), None, "x"),
    "oneOf": (_obj({"oneOf": [{"type": "integer"}, {"type": "boolean"}]}), True, "x"),
    "allOf": (_obj({"allOf": [{"type": "integer"}, {"minimum": 3}]}), 4, 2),
    "recursive $ref": ({"$ref": "#/$defs/N", "$defs": {"N": {"type": "object", "additionalProperties": False,
                                                             "properties": {"n": {"$ref": "#/$defs/N"}}}}},
                       None, None),
    "additionalProperties: schema": ({"type": "object", "additionalProperties": {"type": "integer"}},
                                     None, None),
    "required + optional": ({"type": "object", "additionalProperties": False, "required": ["a"],
                             "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}, None, None),
    "minProperties/maxProperties": ({"type": "object", "additionalProperties": {"type": "integer"},
                                     "maxProperties": 1}, None, None),
    "patternProperties": ({"type": "object", "patternProperties": {"^x_": {"type": "integer"}},
                           "additionalProperties": False}, None, None),
    "not": (_obj({"not": {"type": "string"}}), 1, "s"),
    "if/then/else": (_obj({"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}}), 1, -1),
}

# whole-document instances for the features above whose schema is not _obj(...)
FEATURE_DOCS: dict[str, tuple[object, object]] = {
    "recursive $ref": ({"n": {"n": {}}}, {"n": {"m": 1}}),
    "additionalProperties: schema": ({"a": 1, "b": 2}, {"a": "x"}),
    "required + optional": ({"a": 1}, {"b": 1}),
    "minProperties/maxProperties": ({"a": 1}, {"a": 1, "b": 2}),
    "patternProperties": ({"x_a": 1}, {"y": 1}),
}


def feature_instances(name: str) -> tuple[object, object]:
    """(valid, invalid) whole documents of feature `name`."""
    if name in FEATURE_DOCS:
        return FEATURE_DOCS[name]
    _, good, bad = FEATURES[name]
    return {"v": good}, {"v": bad}
