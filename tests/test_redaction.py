"""Issue 35 point 1: secrets that leaked and ordinary code that was eaten, measured both ways (benchmarks/redaction.py has the full figures).

Every family of tests/secret_families.py must be gone wherever it appears: user text, a tool result (JSON text), a tool
input (redact_json); the issue's ordinary code must come back unchanged; gitleaks' rule test cases are caught in context.
"""
import gzip, json, sys
from pathlib import Path

import pytest

from composer_replication.ingestion.redact import redact_json, redact_secrets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from secret_families import FAMILIES  # noqa: E402

PLACES = {"user text": lambda t: redact_secrets(t),
          "tool result": lambda t: json.loads(redact_secrets(json.dumps({"type": "tool_result", "content": t})))["content"],
          "tool input": lambda t: redact_json({"command": t, "env": {"X": t}})["command"]}

@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("family,text,secrets", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_gone_everywhere(family, text, secrets, place):
    out = PLACES[place](text)
    for s in secrets: assert s not in out, f"{family} ({place}): {s!r} survived in {out!r}"
    assert "[REDACTED:" in out and redact_secrets(out) == out

ORDINARY = [  # the examples, and what the installed-package sample showed (API schemas, minified JS)
    '<Row key="row-item-42" />', 'cache_key = "v2_users_list"', '{"key": "user_profile_2"}',
    '"input_token": "NextToken",\n      "output_token": "NextMarker"', '"result_key": "TopicsDetectionJobProperties"',
    'if(e.key===`Backspace`||e.key===`Delete`)', '{enterTargetKey:r,skipEnterTargetFocusSync:!0}', 'f.propertyKey=e=>f.any([f.string])',
    '{"license": {"key": "apache-2.0"}}', '_ROUTER_JWT_WITHOUT_TOKEN = "ray-sandbox-facade"', 'auth_token = base64.b64encode(auth_value)',
    '"AWS::ApiGateway::ApiKey": "b899a0d240b53d9d"', 'Token:              "#d0d0d0",', 'ssh_private_key: ~/ray-bootstrap-key.pem',
    '"pbkdf2-password": "1.2.1"', '"MasterUserPassword": "mynewpassword"', 'pass the --username and --password options instead',
    "'gss_krb5_lucid_key', 'gss_krb5_rfc1964_keydata'", 'apiKey: azureADTokenProvider ?? apiKey', '"ChangeToken": "abcd12f2-46da-4fdb-b8d5-fbd4c466928f"',
    "mysql -u root -p shop", "curl -u $USER:$TOKEN https://x", "echo $CR_PAT | docker login ghcr.io -u me --password-stdin",
    "passphrase: <your passphrase>", "sshpass -p \"$SSHPASS\" ssh host",
]

@pytest.mark.parametrize("line", ORDINARY)
def test_ordinary_code_unchanged(line):
    assert redact_secrets(line) == line
    assert redact_secrets(json.dumps(line)) == json.dumps(line)

def test_gitleaks_cases_caught():
    "gitleaks' rule test cases (MIT, benchmarks/data/SOURCES.md): 97% caught in context, every family of prefixed token bare."
    with gzip.open(ROOT / "benchmarks" / "data" / "gitleaks_tp.jsonl.gz", "rt") as fh: cs = [json.loads(l) for l in fh]
    assert len(cs) > 5000
    missed = [c for c in cs if c["secret"] in redact_secrets(c["text"])]
    assert len(missed) / len(cs) < 0.03, len(missed)
    bare = [c for c in cs if c["unique_prefix"] and c["rule"] not in ("jwt", "atlassian-api-token")]  # random `ey...` are not JWTs; 24-char Atlassian tokens have no prefix
    assert [c["rule"] for c in bare if c["secret"] in redact_secrets(f"the value is {c['secret']} (dashboard)")] == []
