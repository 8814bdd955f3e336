"""The webhook allow-list (`WebhookPolicy`), pure: which URLs alerts may go to.

The API and delivery paths are in tests/security/test_webhooks.py; here the
URL forms: origins compared with their default port and case, the hook path
required, user info, queries and other ports refused, the config's list.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runyard.contracts.webhooks import WebhookPolicy, WebhookRefused, policy_of

FEISHU = WebhookPolicy()
SELF_HOSTED = WebhookPolicy(("https://open.feishu.cn", "https://feishu.example.com:8443"))


@pytest.mark.parametrize(
    "url",
    [
        "https://open.feishu.cn/open-apis/bot/v2/hook/0123-abcd",
        "https://OPEN.FEISHU.CN:443/open-apis/bot/v2/hook/0123-abcd",
        "https://open.feishu.cn./open-apis/bot/v2/hook/0123-abcd",
        "https://open.larksuite.com/open-apis/bot/v2/hook/0123_abcd",
    ],
)
def test_feishu_and_lark_bots_are_allowed(url: str) -> None:
    assert FEISHU.problem(url) is None


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://open.feishu.cn/open-apis/bot/v2/hook/abc", "not allowed"),
        ("https://open.feishu.cn:8443/open-apis/bot/v2/hook/abc", "not allowed"),
        ("https://[::1]/open-apis/bot/v2/hook/abc", "not allowed"),
        ("https://user:pw@open.feishu.cn/open-apis/bot/v2/hook/abc", "user name or password"),
        ("https://open.feishu.cn/open-apis/bot/v2/hook/", "custom bot's webhook"),
        ("https://open.feishu.cn/open-apis/im/v1/messages", "custom bot's webhook"),
        ("https://open.feishu.cn/open-apis/bot/v2/hook/abc?next=http://x", "custom bot's webhook"),
        ("https://open.feishu.cn/open-apis/bot/v2/hook/a/../../../x", "custom bot's webhook"),
        ("ftp://open.feishu.cn/open-apis/bot/v2/hook/abc", "not allowed"),
        ("https://open.feishu.cn:99999/open-apis/bot/v2/hook/abc", "not allowed"),
    ],
)
def test_other_urls_are_refused_with_a_reason_and_a_hint(url: str, words: str) -> None:
    with pytest.raises(WebhookRefused) as refused:
        FEISHU.check(url)
    assert words in refused.value.reason
    assert "https://open.feishu.cn/open-apis/bot/v2/hook/<token>" in refused.value.hint


def test_a_self_hosted_feishu_is_allowed_only_when_listed() -> None:
    url = "https://feishu.example.com:8443/open-apis/bot/v2/hook/abc"
    assert FEISHU.problem(url) is not None
    assert SELF_HOSTED.problem(url) is None
    assert SELF_HOSTED.problem("https://open.larksuite.com/open-apis/bot/v2/hook/abc")


def test_the_config_list_replaces_the_default_and_bad_entries_are_refused(tmp_path: Path) -> None:
    assert policy_of(tmp_path) == WebhookPolicy()
    (tmp_path / "notification.yaml").write_text("webhook_origins: ['http://127.0.0.1:9000']\n")
    local = policy_of(tmp_path)
    assert local.problem("http://127.0.0.1:9000/open-apis/bot/v2/hook/abc") is None
    assert local.problem("https://open.feishu.cn/open-apis/bot/v2/hook/abc") is not None
    with pytest.raises(ValueError, match="scheme://host"):
        WebhookPolicy.from_config({"webhook_origins": ["open.feishu.cn"]})
    with pytest.raises(ValueError, match="list"):
        WebhookPolicy.from_config({"webhook_origins": "https://open.feishu.cn"})
