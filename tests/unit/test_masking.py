"""The redaction set: each rule masks what it names (in text, in a query string, in JSON) and leaves alone
what only looks like it — a 16-digit number that fails the Luhn check, an order number, a word that
merely contains a credential's name. The hook, the plugin and the codec server mask with this one set."""

from __future__ import annotations

import json

import pytest

from client.codec import mask_payload
from hooks.builtin.secret_redaction import SecretRedactionHook
from workflows import story
from workflows.masking import COMMON_SECRET_PATTERNS, MASK, luhn_valid, redact

# (rule, text that carries a secret, the secret itself)
POSITIVE = [
    ("card_number", "card 4111 1111 1111 1111 exp 12/30", "4111 1111 1111 1111"),
    ("card_number", "card 4111-1111-1111-1111.", "4111-1111-1111-1111"),
    ("card_number", "pan=5500005555555559;", "5500005555555559"),
    ("card_number", "amex 3782 822463 10005", "3782 822463 10005"),
    ("card_number", "amex 378282246310005", "378282246310005"),
    ("us_ssn", "SSN 123-45-6789, born", "123-45-6789"),
    ("us_ssn", "ssn 123 45 6789", "123 45 6789"),
    ("aws_access_key_id", "id AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_access_key_id", "ASIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE"),
    (
        "aws_secret_access_key",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        "aws_secret_access_key",
        '{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}',
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    ("github_token", "token ghp_" + "a1B2" * 9, "ghp_" + "a1B2" * 9),
    ("github_token", "oauth gho_" + "Z9y8" * 9, "gho_" + "Z9y8" * 9),
    ("github_token", "github_pat_11ABCDEFG0_" + "x" * 59, "github_pat_11ABCDEFG0_" + "x" * 59),
    ("gitlab_token", "glpat-" + "AbCdEfGhIj" * 2, "glpat-" + "AbCdEfGhIj" * 2),
    ("slack_token", "xoxb-123456789012-abcdefABCDEF", "xoxb-123456789012-abcdefABCDEF"),
    ("slack_token", "xoxp-123456789012-abcdefABCDEF", "xoxp-123456789012-abcdefABCDEF"),
    ("api_key_sk", "OPENAI sk-proj-" + "q" * 24, "sk-proj-" + "q" * 24),
    ("api_key_sk", "ANTHROPIC sk-ant-api03-" + "w" * 24, "sk-ant-api03-" + "w" * 24),
    ("google_api_key", "key=AIza" + "S" * 35, "AIza" + "S" * 35),
    ("stripe_key", "stripe sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("stripe_key", "rk_test_" + "4eC39HqLyjWDarjtT1zdp7dc", "rk_test_4eC39HqLyjWDarjtT1zdp7dc"),
    (
        "private_key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA",
    ),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "eyJhbGciOiJIUzI1NiJ9"),
    ("bearer_token", "Authorization: Bearer abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz"),
    ("credential", "login password=hunter22 ok", "hunter22"),
    ("credential", "secret: s3cr3t-value", "s3cr3t-value"),
    ("credential", "https://api.example/v1?token=abc123def&page=2", "abc123def"),
    ("credential", '{"api_key": "k-9f8e7d6c"}', "k-9f8e7d6c"),
    ("credential", "client_secret='0a1b2c3d'", "0a1b2c3d"),
]

NEGATIVE = [
    ("card_number", "order 4111 1111 1111 1112 shipped"),  # fails the Luhn check
    ("card_number", "1234567812345678"),  # 16 digits, not Luhn-valid
    ("card_number", "id 41111111111111110000000"),  # a longer run of digits
    ("card_number", "4111 1111-1111 1111"),  # separators that change within the number
    ("card_number", "call 415 555 2671"),
    ("us_ssn", "000-12-3456"),
    ("us_ssn", "666-12-3456"),
    ("us_ssn", "123-00-6789"),
    ("us_ssn", "123-45-67890"),
    ("us_ssn", "2024-01-15"),
    ("aws_access_key_id", "AKIA1234"),
    ("aws_secret_access_key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),  # no name beside it: too common a shape
    ("github_token", "ghp_short"),
    ("gitlab_token", "glpat-short"),
    ("slack_token", "xoxb-short"),
    ("api_key_sk", "task-sk-1"),
    ("google_api_key", "AIzaShort"),
    ("stripe_key", "sk_live_short"),
    ("private_key", "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----"),
    ("credential", "max_tokens: 1000"),
    ("credential", "the secret: it"),  # a value of fewer than four characters
    ("credential", "tokens: 1200"),
    ("credential", "password=[REDACTED]"),  # already masked: masked once, counted once
]


@pytest.mark.parametrize(("rule", "text", "secret"), POSITIVE, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(POSITIVE)])
def test_each_rule_masks_what_it_names(rule, text, secret):
    masked, counts = redact(text)
    assert secret not in masked and MASK in masked
    assert counts.get(rule, 0) >= 1, counts


@pytest.mark.parametrize(("rule", "text"), NEGATIVE, ids=[f"{r}-{i}" for i, (r, _) in enumerate(NEGATIVE)])
def test_each_rule_leaves_alone_what_only_looks_like_it(rule, text):
    masked, counts = redact(text)
    assert rule not in counts and masked == text


def test_a_credential_keeps_its_name_and_loses_its_value():
    assert redact("password=hunter22&user=bob")[0] == f"password={MASK}&user=bob"
    assert redact('{"token": "abcd1234"}')[0] == f'{{"token": "{MASK}"}}'


def test_luhn():
    assert luhn_valid("4111111111111111") and luhn_valid("378282246310005") and luhn_valid("0")
    assert not luhn_valid("4111111111111112") and not luhn_valid("1234567812345678")


def test_every_rule_has_cases_here():
    assert {rule for rule, _, _ in POSITIVE} == set(COMMON_SECRET_PATTERNS)
    assert {rule for rule, _ in NEGATIVE} <= set(COMMON_SECRET_PATTERNS)


TEXT = "pay with 4111 1111 1111 1111, ssn 123-45-6789, key AKIAIOSFODNN7EXAMPLE, password=hunter22"
SECRETS = ["4111 1111 1111 1111", "123-45-6789", "AKIAIOSFODNN7EXAMPLE", "hunter22"]


def test_the_hook_the_story_and_the_codec_server_mask_the_same_set():
    class Context:
        def report_effect(self, *args, **kwargs):
            pass

    shown = [
        SecretRedactionHook().after_synthesis(Context(), TEXT),  # type: ignore[arg-type]
        story.excerpt(TEXT),
        json.loads(mask_payload(_json_payload(TEXT)).data),
    ]
    for text in shown:
        assert not [s for s in SECRETS if s in text], text


def _json_payload(text: str):
    from temporalio.api.common.v1 import Payload

    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(text).encode())
