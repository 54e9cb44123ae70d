"""A PostgreSQL URL that libpq cannot parse (or with a bad query) is one line that names
the problem and never the password: libpq quotes the URL in its error."""

from __future__ import annotations

import pytest

from runnerctl.controller.store import Store
from runnerctl.controller.store_db import describe_url
from runnerctl.errors import ConfigError, RunnerctlError
from runnerctl.optuna import make_storage
from runnerctl.postgres import PostgresError, libpq_url, ping

BAD = ["postgresql://ann:s3cret@[::1/db", "postgresql://ann:s3cret@db.lab/x?bogus"]
TWO_ATS = ["postgresql://ann:s3@cret@db.lab:5433/rc", "journal+postgresql://ann:s3cr@t@db.lab/rc",
           "postgresql://ann:s3?cr@t@db.lab/rc"]


@pytest.mark.parametrize("url", BAD)
def test_ping_says_why_without_the_password(url: str) -> None:
    with pytest.raises(PostgresError) as caught:
        ping(url)
    text = str(caught.value)
    assert text.startswith("cannot reach PostgreSQL: ") and "\n" not in text
    assert "s3cr" not in text and ("IPv6" in text or "bogus" in text)


@pytest.mark.parametrize("url", BAD)
def test_the_store_says_why_without_the_password(url: str) -> None:
    with pytest.raises(RunnerctlError) as caught:
        Store.open(url=url, timeout_s=1)
    assert "s3cr" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_url_that_cannot_be_split_is_described_without_it() -> None:
    assert describe_url(BAD[0]) == "postgresql://(a URL that cannot be parsed)"
    assert describe_url("postgresql://ann:pw@db.lab:5433/rc") == "postgresql://db.lab:5433/rc"


@pytest.mark.parametrize("url", TWO_ATS)
def test_an_unescaped_at_in_the_password_is_refused_before_libpq_quotes_its_tail(url: str) -> None:
    """libpq splits the URL at its first '@' and names the rest as the host it cannot
    resolve ("failed to resolve host 'cret@db.lab'"), a part of the password."""
    for attempt in (lambda: ping(url), lambda: Store.open(url=url, timeout_s=1)):
        with pytest.raises(RunnerctlError) as caught:
            attempt()
        text = str(caught.value)
        assert "%40" in text and "\n" not in text, text
        assert not any(part in text for part in ("s3", "cret", "cr@t", "db.lab")), text
    assert libpq_url("postgresql://ann:s3%40cret@db.lab/rc") == "postgresql://ann:s3%40cret@db.lab/rc"


@pytest.mark.parametrize("url", [
    "postgresql://ann:pw@db.lab/rc?application_name=a@b", "postgresql://ann:pw@db.lab?options=-c%20x=a@b",
    "postgresql:///rc?host=/run/postgresql", "postgresql://ann@[::1]:5433/rc", "postgresql://a%40b:p%40w@h/rc"])
def test_urls_with_an_at_after_the_host_or_none_are_taken(url: str) -> None:
    assert libpq_url(url) == url


def test_an_optuna_rdb_url_with_two_ats_is_refused_before_sqlalchemy_quotes_its_tail() -> None:
    with pytest.raises(ConfigError, match="%40"):
        make_storage("postgresql+psycopg://ann:s3@cret@127.0.0.1:9/rc")
