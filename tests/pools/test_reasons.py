from pathlib import Path

from pools.reasons import Reason

DOC = Path(__file__).resolve().parents[2] / "docs" / "reason-codes.md"


def test_every_reason_code_is_documented():
    text = DOC.read_text()
    missing = [code for code in Reason.values if f"`{code}`" not in text]
    assert not missing, f"document these in docs/reason-codes.md: {missing}"
