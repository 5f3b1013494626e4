"""judge_report: how the submission's own text enters the report, printable, marked and bounded."""
import judge_report


def test_control_characters_are_written_out_and_lines_stay():
    text = "ok\tline\n\x1b[2Jcleared\rback\u2028sep\ud800"
    shown = judge_report.printable(text)
    assert shown == "ok\tline\n\\x1b[2Jcleared\\x0dback\\u2028sep\\ud800"


def test_every_line_from_the_submission_is_marked_and_a_flood_is_cut():
    assert judge_report.from_submission("a\nb") == "submission> a\nsubmission> b"
    flood = judge_report.from_submission("x\n" * 100_000)
    lines = flood.splitlines()
    assert len(lines) == judge_report.SUBMISSION_TEXT_LINES + 1 and all(l.startswith("submission> ") for l in lines)
    assert "cut: the submission's text ran to 200,000 characters" in lines[-1]
