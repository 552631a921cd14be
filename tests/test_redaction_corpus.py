"""Redaction corpora (issue 22 point 1): every secret family is removed, ordinary code stays byte-identical.

The family corpus is synthetic: obviously fake values in realistic shapes, built from pieces so that this file holds no
string a secret scanner would flag. The clean corpus is tests/fixtures/redaction_clean/ (hand-written ordinary code that
mentions passwords, tokens and keys without containing one) plus the real public sessions in ../shared/fixtures/claude_code/
(read from there, never copied), whose every JSON string must come back unchanged.
"""
import json, os, random, sys, time
from pathlib import Path

import orjson
import pytest

from composer_replication.ingestion.redact import redact_json, redact_secrets

ROOT = Path(__file__).resolve().parents[1]
CLEAN = ROOT / "tests" / "fixtures" / "redaction_clean"
SHARED = ROOT.parent / "shared" / "fixtures" / "claude_code"
NEWFIX = ROOT / "tests" / "fixtures" / "claude_code"

A40 = "wJalrXUtnFEMI" + "/K7MDENG/bPxRfi" + "CYzEXAMPLEKEY1"        # AWS-documentation-shaped, 41 chars
B64 = "QWxhZGRpbjpv" + "cGVuIHNlc2FtZQ"                            # base64 of a user:password pair
HEX = "7f3a9c" + "e1b2d4" + "0a5f6e" + "8c9b1d2e3f4a"                  # a 24-digit hex id
TOK = "a1B2c3D4e5" * 3 + "F6g7H8"                                     # 36 token characters
PEM = ["MIIEvQIBADAN" + "BgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7" + "VJTUt9Us8cKj" + "MzEfYyjiWA4R",
       "4/M2bS1GB4t7" + "NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu" + "NMoSfm76oqFv" + "AP8GyQ9aQ2Za",
       "cf8W9sOy3oHF" + "L1oTTsrvU3Hs5EZ2TQ8pvJUmpsDx9NArGtBd2fE9" + "IPn82cZWrVJe" + "oV3bxPkoGtz1",
       "5h0sQXo2dBcN" + "8Gkq"]
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0." + TOK

def pem_body(sep="\n"): return sep.join(PEM)

# (family, text, the secret values that must be gone)
FAMILIES = [
    ("aws credentials file", f"[default]\naws_access_key_id = AKIA{'IOSFODNN7EXAMPL9'}\naws_secret_access_key = {A40}\n", ["AKIAIOSFODNN7EXAMPL9", A40]),
    ("aws session token", f"aws_session_token={A40}{A40}", [A40]),
    ("aws configure set", f"$ aws configure set aws_secret_access_key {A40} --profile prod", [A40]),
    ("gcp service account", json.dumps({"type": "service_account", "project_id": "demo", "private_key_id": HEX + "0f1e2d3c4b5a",
                                        "private_key": "-----BEGIN " + "PRIVATE KEY-----\n" + pem_body() + "\n-----END " + "PRIVATE KEY-----\n",
                                        "client_email": "ci@demo.iam.gserviceaccount.com"}, indent=2), [HEX + "0f1e2d3c4b5a", PEM[0], PEM[3]]),
    ("azure connection string", "DefaultEndpointsProtocol=https;AccountName=demo;AccountKey=" + A40.replace("/", "+") + "Zm9vYmFy==;EndpointSuffix=core.windows.net",
     [A40.replace("/", "+")]),
    ("azure sas url", "https://demo.blob.core.windows.net/c/f.txt?sv=2022-11-02&se=2030-01-01&sp=r&sig=" + "Zm9vYmFyYmF6cXV4" + "%2Bq1w2e3r4t5y6%3D", ["Zm9vYmFyYmF6cXV4"]),
    ("postgres url", "DATABASE_URL=postgres://app:" + "s3cr3t-Pa55" + "@db.internal:5432/app", ["s3cr3t-Pa55"]),
    ("mongodb+srv url", "mongodb+srv://admin:" + "Tr0ub4dor3" + "@cluster0.ab1cd.mongodb.net/test?retryWrites=true", ["Tr0ub4dor3"]),
    ("ado connection string", "Server=tcp:db.example.net,1433;Database=app;User Id=sa;Password=" + "Pa55w0rd!x" + ";Encrypt=True;", ["Pa55w0rd!x"]),
    ("ado Pwd", 'conn = "Driver={ODBC Driver 18};Server=db;Uid=app;Pwd=' + "hunter2hunter" + ';"', ["hunter2hunter"]),
    ("yaml lower-case password", "database:\n  user: app\n  password: " + "hunter2" + "\n  host: db\n", ["hunter2"]),
    ("ini db_password", 'db_password = "' + "c0rrect-h0rse" + '"\n', ["c0rrect-h0rse"]),
    ("python password literal", "password = '" + "hunter2x" + "'", ["hunter2x"]),
    ("compose environment map", "services:\n  db:\n    environment:\n      POSTGRES_PASSWORD: " + "example" + "\n      POSTGRES_USER: app\n", ["example\n"]),
    ("compose environment list", "    environment:\n      - MYSQL_ROOT_PASSWORD=" + "my-s3cret-pw" + "\n      - MYSQL_DATABASE=app\n", ["my-s3cret-pw"]),
    ("dotenv", "DB_PASS=" + "hunter2hunter" + "\nJWT_SECRET=" + "abcdefgh" + "\nDEBUG=true\n", ["hunter2hunter", "abcdefgh"]),
    ("netrc one line", "machine api.heroku.com login me@example.com password " + "c0ffee-beef-42", ["c0ffee-beef-42"]),
    ("netrc multi line", "machine github.com\n  login octocat\n  password " + "gh0stPassw0rd" + "\n", ["gh0stPassw0rd"]),
    ("docker config auth", json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": B64}}}, indent=1), [B64]),
    ("docker login -p", "docker login -u ci -p " + "dckr-Pa55-77" + " registry.example.com", ["dckr-Pa55-77"]),
    ("docker login --password", "docker login --username ci --password " + "'dckr-Pa55-77'" + " ghcr.io", ["dckr-Pa55-77"]),
    ("npm _authToken", "//npm.pkg.github.com/:_authToken=" + "8f14e45f-ceea-467a-9575-" + "5d6b1c3e2a90", ["8f14e45f-ceea-467a-9575-5d6b1c3e2a90"]),
    ("npm token", "//registry.npmjs.org/:_authToken=npm_" + TOK, ["npm_" + TOK]),
    ("pypirc password", "[pypi]\nusername = __token__\npassword = " + "s3cr3t!pypi" + "\n", ["s3cr3t!pypi"]),
    ("pypi token", "[pypi]\npassword = pypi-AgEIcHlwaS5vcmc" + TOK * 2, ["pypi-AgEIcHlwaS5vcmc"]),
    ("kubeconfig token", "users:\n- name: admin\n  user:\n    token: " + "kube" + HEX + "\n", ["kube" + HEX]),
    ("kubeconfig client-key-data", "    client-certificate-data: LS0tLS1CRUdJTi\n    client-key-data: " + "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQ" + "==\n",
     ["LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQ"]),
    ("github classic", "git clone https://ghp_" + TOK + "@github.com/o/r", ["ghp_" + TOK]),
    ("github fine-grained", "GH=github_pat_" + "11ABCDEFG0" + "a" * 12 + "_" + TOK, ["github_pat_11ABCDEFG0"]),
    ("gitlab", "glpat-" + TOK[:20], ["glpat-" + TOK[:20]]),
    ("slack bot", "xoxb-" + "1234567890-" + "abcdefghij", ["xoxb-1234567890-abcdefghij"]),
    ("slack user", "xoxp-" + "1234567890-" + "0987654321-abcdef", ["xoxp-1234567890"]),
    ("huggingface", "HF_TOKEN=hf_" + TOK, ["hf_" + TOK]),
    ("stripe live", "stripe.api_key = 'sk_live_" + TOK[:24] + "'", ["sk_live_" + TOK[:24]]),
    ("jwt", "id_token: " + JWT, [JWT]),
    ("authorization bearer", "curl -H 'Authorization: Bearer " + TOK + "' https://api", [TOK]),
    ("authorization token", "Authorization: token " + HEX + "abcdef", [HEX]),
    ("x-api-key header", "curl -H 'X-Api-Key: " + HEX + "' https://api", [HEX]),
    ("openai key", "OPENAI_API_KEY=sk-proj-" + TOK, ["sk-proj-" + TOK]),
    ("pem body without BEGIN", "...[truncated]\n" + pem_body() + "\n-----END " + "RSA PRIVATE KEY-----\n", [PEM[0], PEM[2]]),
    ("pem body, no BEGIN, no END", "output cut:\n" + pem_body() + "\n", [PEM[0], PEM[1], PEM[2]]),
    ("pem body in JSON", json.dumps({"stdout": pem_body() + "\n-----END " + "PRIVATE KEY-----"}), [PEM[0], PEM[3]]),
    ("key wrapped by \\", "export OPENAI_API_KEY=sk-proj-" + TOK[:12] + "\\\n" + TOK[12:], ["sk-proj-" + TOK[:12], TOK[12:]]),
    ("key wrapped by JSON \\n", json.dumps({"cmd": "export HF_TOKEN=hf_" + TOK[:14] + "\n" + TOK[14:]}), ["hf_" + TOK[:14], TOK[14:]]),
    ("--password flag", "mysql --user root --password " + "Sup3rS3cret" + " app", ["Sup3rS3cret"]),
    ("--token= flag", "run --token=" + "abcd1234efgh", ["abcd1234efgh"]),
]

def _clean_files():
    return sorted(p for p in CLEAN.iterdir() if p.is_file())

@pytest.mark.parametrize("family,text,secrets", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_is_redacted(family, text, secrets):
    c = {}
    out = redact_secrets(text, c)
    for s in secrets: assert s not in out, f"{family}: {s!r} survived in {out!r}"
    assert sum(c.values()) >= 1 and "[REDACTED:" in out
    assert redact_secrets(out) == out  # idempotent

@pytest.mark.parametrize("family,text,secrets", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_inside_json(family, text, secrets):
    "Redacting a JSON document (a request body, a journal line) keeps it parseable and removes the secret."
    doc = json.dumps({"messages": [{"role": "user", "content": text}], "n": 1})
    out = redact_secrets(doc)
    back = json.loads(out)  # still JSON
    assert back["n"] == 1 and back["messages"][0]["role"] == "user"
    for s in secrets: assert s not in out and s not in back["messages"][0]["content"], (family, out)
    assert redact_secrets(out) == out

def test_clean_corpus_is_byte_identical():
    files = _clean_files()
    assert len(files) >= 9
    n_lines = 0
    for p in files:
        t = p.read_text()
        n_lines += t.count("\n")
        c = {}
        assert redact_secrets(t, c) == t, (p.name, c)
        for line in t.splitlines():  # and line by line, as a tool result might show one line
            assert redact_secrets(line) == line, (p.name, line)
        assert redact_secrets(json.dumps(t)) == json.dumps(t), p.name  # and JSON-escaped
    assert n_lines >= 150

DJANGO_LINES = [
    'SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY")', 'SECRET_KEY = os.getenv("SECRET_KEY")', "API_KEY = process.env.API_KEY;",
    "NPM_TOKEN: ${{ secrets.NPM_TOKEN }}", "API_KEY=${API_KEY}", "SECRET_KEY = settings.SECRET_KEY", 'password = config["password"]',
    "login(password=password)", "password: str", "def check_password(self, password):", 'token = vault.read("secret/app")',
    "password = getpass()", "API_KEY=<your-key>", "SECRET_KEY=changeme", "api_key: xxx", "password: '***'", "TOKEN = token",
    '"PASSWORD": env("DB_PASSWORD"),', "const { password } = req.body;", "user.password = hashedPassword;", "password: hashedPassword,",
    "DATABASE_URL=postgres://user:password@localhost/db", "STRIPE_SECRET_KEY=sk_test_xxx", "--token TOKEN", "--password PASSWORD",
    "docker login -u ci --password-stdin", "machine learning password policy", "the password must have 12 characters",
]

@pytest.mark.parametrize("line", DJANGO_LINES)
def test_code_is_not_a_secret(line):
    assert redact_secrets(line) == line

def _strings(o):
    if isinstance(o, str): yield o
    elif isinstance(o, dict):
        for k, v in o.items(): yield k; yield from _strings(v)
    elif isinstance(o, list):
        for v in o: yield from _strings(v)

@pytest.mark.skipif(not SHARED.exists(), reason="../shared/fixtures/claude_code missing")
def test_real_sessions_unchanged():
    files = sorted(SHARED.rglob("*.jsonl")) + sorted(NEWFIX.rglob("*.jsonl"))
    strs = [s for f in files for l in f.read_bytes().splitlines() if l.strip().endswith(b"}") for s in _strings(orjson.loads(l))]
    c = {}
    assert [redact_secrets(s, c) for s in strs] == strs, c
    assert c == {}
    for f in files:  # whole lines, as JSON text, too
        for l in f.read_text().splitlines():
            assert redact_secrets(l) == l, (f.name, l[:200])

def test_idempotent_and_json_safe_random():
    "Random mixes of secret-shaped pieces: a second pass changes nothing, and a JSON dump stays parseable."
    rng = random.Random(0)
    pieces = [t for _, t, _ in FAMILIES] + ["\n", "\\", '"', "'", " ", "=", ": ", "password", "token", "\\n", "${X}", "-----END RSA PRIVATE KEY-----", "PASSWORD=", "a"]
    for _ in range(3000):
        t = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        once = redact_secrets(t)
        assert redact_secrets(once) == once, t
        doc = json.dumps({"k": t, "l": [t, 1]})
        red = redact_secrets(doc)
        back = json.loads(red)
        assert redact_secrets(red) == red
        assert back["l"][1] == 1

def test_redact_json_matches_redact_secrets():
    v = {"env": {"DB_PASSWORD": "hunter2hunter"}, "cmd": FAMILIES[2][1]}
    out = redact_json(v)
    assert A40 not in json.dumps(out)
    assert out["cmd"] == redact_secrets(FAMILIES[2][1])
