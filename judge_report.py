"""The report: what the run prints (stdout) and logs for the runner (POPCORN_FD `key: value` lines), and how
the submission's own text enters it (printable, marked `submission>`, bounded)."""
import re
import threading

from judge_cases import TestCase

REPORT_LINE_LIMIT, RELAY_LINE_LIMIT, RELAY_LINE_CHARS = 400, 2000, 2000
# The most of the submission's own free text (an error, a profile table) that one case's report, JSON
# and POPCORN lines carry: a traceback or a torch.profiler table fits; a flood is cut, with a note.
SUBMISSION_TEXT_LINES, SUBMISSION_TEXT_CHARS = 200, 20_000


# Control characters (but newline and tab), Unicode line and paragraph separators (which str.splitlines
# breaks at) and the invisible format characters that reorder or hide text on a display.
_CONTROL_CHARACTERS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: str) -> str:
    """Text from the submission's process as the judge prints it: control characters (terminal escapes,
    carriage returns) and lone surrogates written out as escapes, so that it can neither redraw the
    report on a terminal nor fail to encode; newlines and tabs stay."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL_CHARACTERS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                                   else f"\\u{ord(m.group()):04x}", text)


def from_submission(text: str) -> str:
    """Free text the submission's process sent (its error, a profile table), printable and every line
    marked as the submission's, so that none of it can pass for a line of the report; at most
    SUBMISSION_TEXT_LINES lines and SUBMISSION_TEXT_CHARS characters of it, with a note where it was cut."""
    text = str(text)
    shown = printable(text[:SUBMISSION_TEXT_CHARS])  # escapes lengthen it: cut again after them
    lines = shown[:SUBMISSION_TEXT_CHARS].splitlines()
    kept = lines[:SUBMISSION_TEXT_LINES]
    if len(kept) < len(lines) or len(text) > SUBMISSION_TEXT_CHARS or len(shown) > SUBMISSION_TEXT_CHARS:
        kept.append(f"... (cut: the submission's text ran to {len(text):,} characters; the first "
                    f"{min(len(lines), SUBMISSION_TEXT_LINES)} lines are shown)")
    return "\n".join(f"submission> {line}" for line in kept)


def printable_message(obj):
    """A message from the worker with every string in it made printable."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, list):
        return [printable_message(x) for x in obj]
    if isinstance(obj, dict):
        return {printable(str(k)): printable_message(v) for k, v in obj.items()}
    return obj


class Report:
    """Human-readable lines on stdout, protocol lines on POPCORN_FD when given. The submission's own
    output is relayed on stdout with a prefix, so that it can never pass for the report."""

    def __init__(self, fd_file=None):
        self.fd_file = fd_file
        self.lock = threading.Lock()
        self.relayed = 0
        self.cases = []  # one dict per case, for --json
        self.checked = False  # whether the verdict line is out

    def skipped(self, key: str, case: "TestCase", why: str, line: str) -> None:
        """A case that could not run here: `key` its protocol prefix (test.N, benchmark.N, or '' for none),
        `line` its line in the readable report."""
        if key:
            self.log(f"{key}.status", "skip")
            self.log(f"{key}.message", first_line(why))
        self.record(spec=case.spec, status="skip", message=why)
        self.say(line)

    def record(self, **case) -> None:
        self.cases.append(case)

    def log(self, key, value):
        if key == "check":
            self.checked = True
        if self.fd_file is not None and not self.fd_file.closed:
            print(f"{key}: {value}", file=self.fd_file, flush=True)

    def say(self, text=""):
        with self.lock:
            print(text, flush=True)

    def relay(self, role: str, line: str) -> None:
        with self.lock:
            self.relayed += 1
            if self.relayed <= RELAY_LINE_LIMIT:
                print(f"  {role}> {printable(line[:RELAY_LINE_CHARS])}", flush=True)
            elif self.relayed == RELAY_LINE_LIMIT + 1:
                print(f"  {role}> ... (further output of the submission dropped)", flush=True)


def indented(text: str, spaces: int) -> str:
    """A message under its case's line: every line indented, so that none (a line of the submission's text
    in it above all) starts where the report's own lines do."""
    return "\n".join(" " * spaces + line for line in str(text).strip().splitlines())


def first_line(message: str, limit: int = REPORT_LINE_LIMIT) -> str:
    text = " | ".join(line.strip() for line in str(message).strip().splitlines() if line.strip())
    return text if len(text) <= limit else text[:limit] + " ..."


def triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "not installed"
