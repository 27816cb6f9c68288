"""Every command line the docs show parses with that command's own argparse parser.

The lines are found in README.md and docs/*.md: in fenced code blocks (a line, joined with
the next where it ends in a backslash; a fence tagged `text` is a diagram, not shell, and
is skipped) and in inline code spans (which may run over a line break). A command line is
`python -m zfbench.CMD ...` (any python, `.venv/bin/python`, with environment variables
before it, or `torchrun ... -m zfbench.CMD ...`), `zfbench CMD ...` (the console script)
or `zfbench-simulate ...`; a placeholder for the command (`zfbench.NAME`, `zfbench
COMMAND`) stands for any of them and is skipped. Its arguments end at a shell comment, pipe, redirection or
`;` / `&&`.

Placeholders stand in for values: `<dir>`, `$VAR` / `${VAR}` and ALL-CAPS words (`N`,
`FILE`, `N1,N2,...`). After a flag each becomes a value that flag accepts (its first
choice, `1` for a number, else a dummy word); on its own (`...`, `[flags]`, `<args>`)
it is dropped. A line with `--help` has only its flags checked by name (argparse prints
the help before it checks anything else), and inline code naming a command with no
arguments (`zfbench predict` in a sentence) only has the command checked to exist.
An unknown flag or a value the parser refuses fails with the file, the line and
argparse's message.

The parser: `build_parser()` where the command module has one (run, simulate, predict,
validate, figures). `gradients` and `accuracy` build theirs inside `main`; for those the
test calls `main` with `ArgumentParser.parse_args` replaced by a function that hands back
the parser before anything is parsed (their `main` does no work before `parse_args`).
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from zfbench.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MODULE = re.compile(r"(?<![\w.-])-m\s+zfbench\.([A-Za-z_][\w.]*)")
SCRIPT = re.compile(r"(?:^|(?<=[\s;&|(]))zfbench(-simulate)?(?=\s|$)")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
ANGLED = re.compile(r"<([A-Za-z][\w.,/-]*)>")  # <dir>; not a redirection (`< in`, `>out`)
COMMENT = re.compile(r"(^|\s)#.*$", re.M)
PLACEHOLDER = re.compile(r"^(⟨[^⟩]+⟩|\$\{?\w+\}?|[A-Z][A-Z0-9_]*(,[A-Z0-9_.]+)*(,\.\.\.)?)$")
STANDALONE = re.compile(r"^(\.\.\.|…|\[.*\])$")
HELP = {"-h", "--help"}
STOP = {"|", "||", "&", "&&", ";", ";;", ">", ">>", "<", "<<", "(", ")", "2>", "&>"}
NOT_SHELL = {"text", "txt", "json", "python", "py", "toml", "yaml", "csv"}


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int
    command: str  # a key of zfbench.cli.COMMANDS, or what the doc named instead
    args: tuple[str, ...]
    text: str
    inline: bool = False

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_pieces(text: str) -> list[tuple[int, str, bool]]:
    """(line number, code, inline?) for every fenced shell line and inline code span."""
    pieces, prose, fence, lines = [], [], None, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = (opened.group(1)[0], opened.group(2).lower())
            prose.append((i + 1, ""))
        elif fence is not None and line.strip().startswith(fence[0] * 3):
            fence = None
            prose.append((i + 1, ""))
        elif fence is not None:
            if fence[1] not in NOT_SHELL:
                start, joined = i + 1, line
                while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    joined = joined.rstrip()[:-1] + " " + lines[i]
                pieces.append((start, joined, False))
            prose.append((i + 1, ""))
        else:
            prose.append((i + 1, line))
        i += 1
    # inline code may run over a line break, never over a paragraph break
    paragraph: list[tuple[int, str]] = []
    for number, line in prose + [(len(lines) + 1, "")]:
        if line.strip():
            paragraph.append((number, line))
            continue
        if paragraph:
            starts, joined, offset = [], "", 0
            for n, part in paragraph:
                starts.append((offset, n))
                joined += part + "\n"
                offset = len(joined)
            for match in INLINE.finditer(joined):
                line_no = max(n for o, n in starts if o <= match.start())
                pieces.append((line_no, match.group(1).replace("\n", " "), True))
        paragraph = []
    return pieces


def split_shell(code: str) -> list[str]:
    """Shell words of `code` (quotes honoured, `\\|` as in a Markdown table), punctuation
    (`|`, `;`, `>` ...) as separate words, nothing after a comment."""
    lex = shlex.shlex(code.replace("\\|", "|"), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:  # an unclosed quote in prose: read it without quotes
        return code.split()


def until_stop(words: list[str]) -> tuple[str, ...]:
    out = []
    for word in words:
        if word in STOP:
            break
        out.append(word)
    return tuple(out)


def commands_in(path: Path) -> list[DocCommand]:
    found = []
    for line, text, inline in code_pieces(path.read_text()):
        # a comment is prose; <dir> becomes one shell word (shlex would read `<` and `>`)
        code = ANGLED.sub("\u27e8\\1\u27e9", COMMENT.sub("", text))
        for match in MODULE.finditer(code):
            name = match.group(1)
            if PLACEHOLDER.match(name):
                continue  # `python -m zfbench.NAME`: any command
            found.append(DocCommand(path, line, name,
                                    until_stop(split_shell(code[match.end():])), text, inline))
        for match in SCRIPT.finditer(code):
            if match.group(1):  # zfbench-simulate
                found.append(DocCommand(path, line, "simulate",
                                        until_stop(split_shell(code[match.end():])), text,
                                        inline))
                continue
            words = until_stop(split_shell(code[match.end():]))
            if not words or words[0].startswith("-") or PLACEHOLDER.match(words[0]):
                continue  # `zfbench` alone, `zfbench --help`, `zfbench COMMAND`
            found.append(DocCommand(path, line, words[0], words[1:], text, inline))
    return found


class _Parser(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


class ArgError(Exception):
    pass


def command_parser(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"zfbench.{name}")
    if hasattr(module, "build_parser"):
        return module.build_parser()

    def capture(self, args=None, namespace=None):
        raise _Parser(self)
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        module.main([])
    except _Parser as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"zfbench.{name}.main returned without parsing its arguments")


def dummy_for(action: argparse.Action | None) -> str:
    if action is not None and action.choices:
        return str(next(iter(action.choices)))
    if action is not None and action.type in (int, float):
        return "1"
    return "placeholder"


def fill_placeholders(parser: argparse.ArgumentParser, args: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for word in args:
        if word in HELP:
            continue
        flag, eq, value = word.partition("=")
        if eq and flag.startswith("--") and PLACEHOLDER.match(value):
            out.append(f"{flag}={dummy_for(parser._option_string_actions.get(flag))}")
            continue
        if PLACEHOLDER.match(word) or STANDALONE.match(word):
            previous = out[-1] if out else ""
            action = parser._option_string_actions.get(previous)
            if previous.startswith("-") and action is not None and action.nargs != 0:
                out.append(dummy_for(action))
            continue  # on its own: "more flags here"
        out.append(word)
    return out


def parse(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    def error(message):
        raise ArgError(message)
    parser.error = error  # plain argparse would print usage and exit; OneLineParser raises
    try:
        return parser.parse_args(args)
    except ArgError:
        raise
    except Exception as err:  # OneLineParser's CliError
        raise ArgError(str(err)) from None


def all_commands() -> list[DocCommand]:
    return [c for path in DOCS for c in commands_in(path)]


FOUND = all_commands()


def test_the_docs_show_the_main_commands():
    """The finder finds something: README's three commands at least."""
    names = {c.command for c in FOUND if c.path.name == "README.md"}
    assert {"run", "simulate"} <= names, names
    assert any(c.args[:4] == ("--model", "llama2-7b", "--gpus", "4") for c in FOUND
               if c.command == "run")


@pytest.mark.parametrize("doc", FOUND, ids=[f"{c.where}:{c.command}" for c in FOUND])
def test_documented_command_parses(doc):
    assert doc.command in COMMANDS, \
        f"{doc.where}: zfbench.{doc.command} is not a zfbench command ({', '.join(COMMANDS)})"
    if doc.inline and not doc.args:
        return  # `zfbench predict` in a sentence names the command; it is not a run
    parser = command_parser(doc.command)
    args = fill_placeholders(parser, doc.args)
    try:
        if HELP & set(doc.args):  # argparse prints help before it checks the rest
            unknown = [w for w in args if w.startswith("-")
                       and w.split("=")[0] not in parser._option_string_actions]
            if unknown:
                raise ArgError(f"unrecognized arguments: {' '.join(unknown)}")
        else:
            parse(parser, args)
    except ArgError as err:
        pytest.fail(f"{doc.where}: `{doc.text.strip()}`: {err}", pytrace=False)


def test_an_unknown_flag_is_reported_with_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Intro with `python -m zfbench.simulate --pcie gen4`.\n\n"
                    "```\n"
                    "python -m zfbench.run --model tiny \\\n"
                    "    --no-such-flag 3   # a comment --also-not-parsed\n"
                    "HF_HUB_OFFLINE=1 .venv/bin/python -m zfbench.gradients --steps N --out <dir>\n"
                    "zfbench predict --paper --out $OUT | tee log\n"
                    "```\n"
                    "```text\n"
                    "zfbench/  python -m zfbench.run  -> real/\n"
                    "```\n")
    found = [(c.line, c.command, c.args) for c in commands_in(page)]
    assert found == [(4, "run", ("--model", "tiny", "--no-such-flag", "3")),
                     (6, "gradients", ("--steps", "N", "--out", "\u27e8dir\u27e9")),
                     (7, "predict", ("--paper", "--out", "$OUT")),
                     (1, "simulate", ("--pcie", "gen4"))]
    run, grads = command_parser("run"), command_parser("gradients")
    with pytest.raises(ArgError, match="unrecognized arguments: --no-such-flag 3"):
        parse(run, fill_placeholders(run, found[0][2]))
    ns = parse(grads, fill_placeholders(grads, found[1][2]))
    assert ns.steps == 1 and ns.out == "placeholder"
