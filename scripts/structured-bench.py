#!/usr/bin/env python3
"""Structured output: 20 JSON schemas of increasing difficulty (nested objects, bounded arrays, enums,
anyOf, string patterns, $defs) x N seeds (temperature 0.7) against an OpenAI-compatible server
(`mens serve` or llama-server): every answer must parse and validate (jsonschema); decode speed with
the schema is compared with the same prompts without it (streamed, usage included, time from the first
to the last chunk over completion_tokens - 1). Needs `jsonschema`; loopback only.

    python3 scripts/structured-bench.py --url http://127.0.0.1:8091 [--seeds 5] [--label mens]
"""
import argparse, json, statistics, sys, time, urllib.parse, urllib.request

import jsonschema

S, I, N, B = {"type": "string", "maxLength": 40}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


def obj(props, req=None, extra=False):
    return {"type": "object", "properties": props, "required": req if req is not None else list(props),
            "additionalProperties": extra}


SCHEMAS = [
    ("a user name", obj({"name": S})),
    ("a user", obj({"name": S, "age": I})),
    ("a product", obj({"title": S, "price": N, "in_stock": B})),
    ("a log level setting", obj({"level": {"enum": ["debug", "info", "warn", "error"]}})),
    ("a list of tags", obj({"tags": {"type": "array", "items": S, "maxItems": 5}})),
    ("a team of 2 to 4 members", obj({"members": {"type": "array", "items": S, "minItems": 2, "maxItems": 4}})),
    ("an address book entry", obj({"name": S, "address": obj({"city": S, "zip": S})})),
    ("a git commit", obj({"sha": S, "author": obj({"name": S, "email": S}), "stats": obj({"added": I, "removed": I})})),
    ("a list of files with sizes", obj({"files": {"type": "array", "maxItems": 4, "items": obj({"path": S, "bytes": I})}})),
    ("a Python identifier", obj({"ident": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,20}$"}})),
    ("an HTTP status", obj({"code": {"type": "integer", "minimum": 100, "maximum": 599}, "reason": S})),
    ("an id that is a number or a string", obj({"id": {"anyOf": [I, S]}})),
    ("a shape", obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "r": N}),
                                         obj({"kind": {"const": "rect"}, "w": N, "h": N})]}})),
    ("a versioned API object", obj({"api_version": {"const": "v1"}, "kind": S})),
    ("a release date", obj({"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}})),
    ("a config with optional fields", obj({"host": S, "port": I, "tls": B, "timeout_s": N}, req=["host"])),
    ("a 2x2 integer matrix", obj({"m": {"type": "array", "minItems": 2, "maxItems": 2,
                                        "items": {"type": "array", "items": I, "minItems": 2, "maxItems": 2}}})),
    ("a server description", obj({"name": S, "cpus": I, "ram_gb": N, "os": {"enum": ["linux", "bsd", "windows"]},
                                  "gpu": B, "region": S, "tags": {"type": "array", "items": S, "maxItems": 3},
                                  "owner": S})),
    ("a function with typed parameters", {"$defs": {"param": obj({"name": {"type": "string", "pattern": "^[a-z_]{1,12}$"},
                                                                  "type": {"enum": ["int", "str", "float", "bool"]}})},
                                          **obj({"name": {"type": "string", "pattern": "^[a-z_]{1,20}$"},
                                                 "params": {"type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/param"}}})}),
    ("a test report", obj({"suite": S, "passed": {"type": "integer", "minimum": 0}, "failed": {"type": "integer", "minimum": 0},
                           "failures": {"type": "array", "maxItems": 3, "items": obj({"test": S, "error": S, "line": {"type": "integer", "minimum": 1}})},
                           "duration": {"anyOf": [N, {"type": "null"}]}, "status": {"enum": ["green", "red"]}})),
]


def chat(url, prompt, schema, seed, max_tokens, model):
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0.7, "seed": seed,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": schema}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, first, last, usage, finish = "", None, None, None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                d = c.get("delta", {}).get("content")
                if d:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text += d
                finish = c.get("finish_reason") or finish
    n = usage["completion_tokens"] if usage else 0
    rate = (n - 1) / (last - first) if first and last and last > first and n > 1 else None
    return text, rate, finish


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--label", default="server")
    a = ap.parse_args()
    if urllib.parse.urlparse(a.url).hostname not in ("127.0.0.1", "localhost"):
        sys.exit("loopback only")
    model = json.loads(urllib.request.urlopen(a.url + "/v1/models").read())["data"][0]["id"]
    ok, total, rates_s, rates_f, fails = 0, 0, [], [], []
    for i, (what, schema) in enumerate(SCHEMAS):
        prompt = f"Write {what} as a JSON object."
        for seed in range(a.seeds):
            text, rate, finish = chat(a.url, prompt, schema, seed, a.max_tokens, model)
            total += 1
            try:
                jsonschema.validate(json.loads(text), schema)
                ok += 1
            except Exception as e:
                fails.append((i + 1, seed, finish, text[:120], str(e)[:120]))
            if rate:
                rates_s.append(rate)
        _, rate, _ = chat(a.url, prompt, None, 0, a.max_tokens, model)
        if rate:
            rates_f.append(rate)
        print(f"schema {i + 1:2d} ({what}): {ok}/{total} valid so far", flush=True)
    for f in fails:
        print("FAIL", f)
    med_s, med_f = statistics.median(rates_s), statistics.median(rates_f)
    print(json.dumps({"label": a.label, "valid": ok, "answers": total, "decode_tok_s_schema_median": round(med_s, 2),
                      "decode_tok_s_free_median": round(med_f, 2), "schema_over_free": round(med_s / med_f, 3)}))


if __name__ == "__main__":
    main()
