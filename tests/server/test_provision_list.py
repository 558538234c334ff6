"""`zeal-server devices provision --from FILE`'s list: what it reads and what it refuses
before any broker is asked (the broker's part: tests/server/broker/test_certificates.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zeal_server.cli.bulk import read_list
from zeal_server.errors import ProvisioningError
from zeal_server.logins import Wanted


def test_a_list_with_comments_requests_and_commas(tmp_path: Path) -> None:
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / "hall.csr").write_bytes(b"REQUEST")
    listed = tmp_path / "fleet.txt"
    listed.write_text(
        "# the fleet\n\nkitchen-1\n  kitchen-2  # the hall's\nhall,requests/hall.csr\n"
    )
    assert read_list(str(listed), certificate=False) == [
        Wanted("kitchen-1"),
        Wanted("kitchen-2"),
        Wanted("hall", certificate=True, csr=b"REQUEST"),
    ]
    assert all(w.certificate for w in read_list(str(listed), certificate=True))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a\nb c d\n", "fleet.txt, line 2: a device id and at most the path of its signing "
                       "request, not 3 fields"),
        ("a\nb missing.csr\n", "fleet.txt, line 2: cannot read its request"),
        ("# nobody\n\n", "no device in the list"),
    ],
)  # fmt: skip
def test_a_bad_list_is_refused_naming_its_line(tmp_path: Path, text: str, says: str) -> None:
    listed = tmp_path / "fleet.txt"
    listed.write_text(text)
    with pytest.raises(ProvisioningError) as raised:
        read_list(str(listed), certificate=False)
    assert raised.value.kind == "invalid"
    assert says in str(raised.value)


def test_the_command_says_what_goes_with_what(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zeal_server.cli.main import main

    env = {"ZEAL_MQTT_URL": "mqtt://127.0.0.1:1", "ZEAL_MQTT_ADMIN_USERNAME": "a",
           "ZEAL_MQTT_ADMIN_PASSWORD": "b"}  # fmt: skip
    listed = tmp_path / "fleet.txt"
    listed.write_text("kitchen-1\n")
    for argv, says in (
        (["devices", "provision"], "name a device, or give a list with --from FILE"),
        (["devices", "provision", "--from", str(listed)],
         "a list needs both --from FILE and --out DIR"),
        (["devices", "provision", "k", "--from", str(listed), "--out", str(tmp_path / "o")],
         "--from provisions the devices of its list: no NAME"),
    ):  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            assert main(argv) == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything was made
