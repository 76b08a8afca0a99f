"""The docs name only what the tree holds: every link, path and symbol that README.md and
docs/*.md cite resolves (issue 32).

The rules, over each page (fenced code blocks apart, except where rule 2 says):

1. Links. A Markdown link ``[text](target)`` whose target has no scheme (not ``https:``,
   ``mailto:``) names a file or folder that exists, relative to the page; a ``#anchor`` (alone:
   on the same page) names a heading of the target page by GitHub's slug (lower case, what is
   not a letter, digit, ``_``, ``-`` or space dropped, spaces to dashes; ``-1``, ``-2`` for
   repeats).
2. Paths. An inline code span that is one word and a path is checked:
   - one that starts with a top-level folder of the repository (``TOP``: ``worker/...``,
     ``benchmarks/...``, ``configs/...``, ``docs/...``) exists from the root (a folder with a
     trailing ``/`` too); ``{a,b}`` alternatives and ``*`` globs each need a match;
   - one that ends in ``.py`` with no such folder (``queue/held.py``, ``prepare.py``: a module
     named within its package) is the end of some file's path in the repository.
   In fenced code blocks, each word that starts with a top-level folder and has a file
   extension (the scripts and configs a command runs) is checked the same way. Skipped:
   placeholders (a part in capitals, ``benchmarks/NAME.py``, or with ``<``), and GENERATED
   (files a documented command writes).
3. Symbols. A definition in a module is a top-level ``def``, ``class``, assignment, import or
   name its ``__all__`` lists; ``Class.name`` is a method, class attribute, field or
   ``self.name =`` of the class or of a base class defined in the repository. Checked:
   - a dotted code span that starts with a project package (``PACKAGES``), with or without
     ``()``: its longest prefix that is a module exists, and the rest names a definition in it
     (``worker.models.architectures.ARCHITECTURES``, ``producer.pipeline``);
   - a ``.py`` path span followed by a name span, directly or with ``'s``
     (`` `producer/client.py` `Client.enqueue` ``, `` `worker/attention/base.py`'s
     `AttentionBackend` ``): the name is defined in that module;
   - a name span followed by a ``.py`` path in parentheses (`` `check_stop` (`worker/...py`) ``)
     when the name reads as code (it has a capital, an ``_`` or a ``.``; a lower-case word such
     as `` `radixq` `` is prose): the name is defined in that module.
   A path without its package (``ledger.py``) stands for every file it ends: one of them must
   define the name; a name with ``*`` (``test_kill_9_*``) needs one definition that matches.
4. History. A paragraph right after the line GONE (an HTML comment, invisible on the page) is
   a dated record of something since removed (docs/performance.md keeps its history): rules 2
   and 3 skip it; its links are still checked.

Not checked: names in prose with no path beside them, ``module:callable`` specs, anything in
a fenced block but paths.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
TOP = (
    "wire", "producer", "worker", "radixq", "benchmarks", "scripts", "configs", "tests", "docs",
    "deploy", "docker", "examples", ".ci",
)  # fmt: skip
PACKAGES = ("wire", "producer", "worker", "radixq", "benchmarks", "tests")
# written by a command the docs give, not kept in the tree
GENERATED = {"docker/compose.gpus.yml"}  # python3 docker/gpu-services.py N
# A paragraph after this line records what was removed: its paths and names are not checked.
GONE = "<!-- docs-check: the paragraph below names what has since been removed -->"
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", "node_modules"}

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SPAN = re.compile(r"`([^`\n]+)`")
NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
PATH_THEN_NAME = re.compile(rf"`([\w./-]+\.py)`(?:'s)?\s+`({NAME})(?:\(\))?`")
NAME_THEN_PATH = re.compile(rf"`({NAME})(?:\(\))?`\s+\(`([\w./-]+\.py)`")
DOTTED = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+(?:\(\))?")
FENCED_PATH = re.compile(rf"(?<![\w/.$-])((?:{'|'.join(re.escape(t) for t in TOP)})/[\w./{{}},*-]*\.\w+)")
EXTENSIONS = re.compile(r"\.(py|md|toml|ya?ml|json|sh|txt|cfg|ini|jsonl)$")


@functools.cache
def repo_files() -> list[str]:
    """Every file of the working tree, relative to the root (caches and the venv left out)."""
    found: list[str] = []
    stack = [REPO_ROOT]
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                if entry.name not in SKIP_DIRS and not entry.name.endswith(".egg-info"):
                    stack.append(entry)
            else:
                found.append(entry.relative_to(REPO_ROOT).as_posix())
    return found


def prose(text: str) -> str:
    """``text`` with its fenced code blocks blanked (line numbers kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def recorded(text: str) -> str:
    """``text`` with each paragraph that follows a GONE marker blanked: a dated record of what
    was removed names what is no longer there (line numbers kept)."""
    return re.sub(
        re.escape(GONE) + r".*?(?=\n[ \t]*\n|\Z)", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S
    )


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (inline code and link targets dropped first)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(page.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def expand(path: str) -> list[str]:
    """``a/{b,c}/d`` -> [a/b/d, a/c/d]."""
    brace = re.search(r"\{([^{}]*)\}", path)
    if not brace:
        return [path]
    return [
        p
        for alt in brace.group(1).split(",")
        for p in expand(path[: brace.start()] + alt + path[brace.end() :])
    ]


def placeholder(path: str) -> bool:
    return "<" in path or any(
        re.fullmatch(r"[A-Z][A-Z0-9_]*", part.split(".")[0]) for part in path.split("/")
    )


def path_problem(path: str) -> str | None:
    """Why a cited path does not resolve (rule 2); None when it does or is not checked."""
    path = path.rstrip(".,;:")
    if path in GENERATED or placeholder(path):
        return None
    if path.split("/")[0] in TOP and "/" in path:
        for one in expand(path):
            if not (list(REPO_ROOT.glob(one.rstrip("/"))) if "*" in one else (REPO_ROOT / one).exists()):
                return f"{one} does not exist"
        return None
    if path.endswith(".py") and not modules_ending(path):
        return f"no file of the repository ends with {path}"
    return None


def modules_ending(path: str) -> list[str]:
    """The files whose path is ``path`` or ends with ``/path`` (``*`` matches within a name)."""
    return [f for f in repo_files() if fnmatch.fnmatchcase(f, path) or fnmatch.fnmatchcase(f, "*/" + path)]


# ---- definitions, read with ast -------------------------------------------------------------


@functools.cache
def tree(file: str) -> ast.Module:
    return ast.parse((REPO_ROOT / file).read_text(), filename=file)


def module_file(dotted: str) -> str | None:
    base = dotted.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if (REPO_ROOT / candidate).is_file():
            return candidate
    return None


def top_level(file: str) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
                names[node.target.id] = node
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, ast.If | ast.Try):  # `if sys.version_info ...`, `try: import`
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree(file).body)
    exported = names.get("__all__")
    if isinstance(exported, ast.Assign) and isinstance(exported.value, ast.List | ast.Tuple):
        for item in exported.value.elts:  # a module-level __getattr__ gives these lazily
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                names.setdefault(item.value, exported)
    return names


def imported_from(node: ast.AST, name: str) -> tuple[str, str] | None:
    """(module file, the name there) a ``from X import name`` brings, when X is in the repo."""
    if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
        return None
    for alias in node.names:
        if (alias.asname or alias.name) == name:
            file = module_file(node.module)
            if file is not None:
                return file, alias.name
            sub = module_file(f"{node.module}.{alias.name}")
            return (sub, "") if sub is not None else None
    return None


def class_members(file: str, node: ast.ClassDef) -> tuple[set[str], bool]:
    """(the names a class defines, with those of its bases in the repository; whether some base
    could not be read, so a name may come from there)."""
    names: set[str] = set()
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign | ast.AnnAssign):
            for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    if target.value.id == "self":
                        names.add(target.attr)
    opaque = False
    for base in node.bases:
        found = find_class(file, base.id) if isinstance(base, ast.Name) else None
        if found is None:
            opaque = opaque or not (isinstance(base, ast.Name) and base.id == "object")
            continue
        more, hidden = class_members(*found)
        names |= more
        opaque = opaque or hidden
    return names, opaque


def find_class(file: str, name: str) -> tuple[str, ast.ClassDef] | None:
    node = top_level(file).get(name)
    if isinstance(node, ast.ClassDef):
        return file, node
    if node is not None:
        origin = imported_from(node, name)
        if origin is not None and origin[1]:
            return find_class(*origin)
    return None


def defines(file: str, names: list[str]) -> bool:
    """Whether ``file`` defines ``names[0]``, and each later name is a member of the one before
    (checked through classes; past a function or a value there is nothing to read)."""
    if "*" in names[0]:  # a pattern (`test_kill_9_*`): some definition matches it
        return any(fnmatch.fnmatchcase(name, names[0]) for name in top_level(file))
    node = top_level(file).get(names[0])
    if node is None:
        return False
    origin = imported_from(node, names[0])
    if origin is not None:
        there, name = origin
        return True if not name else defines(there, [name, *names[1:]])
    if len(names) == 1 or not isinstance(node, ast.ClassDef):
        return True
    members, opaque = class_members(file, node)
    return names[1] in members or opaque


def dotted_problem(dotted: str) -> str | None:
    """Why a dotted reference does not resolve (rule 3, first form)."""
    parts = dotted.removesuffix("()").split(".")
    for cut in range(len(parts), 0, -1):
        file = module_file(".".join(parts[:cut]))
        if file is not None:
            rest = parts[cut:]
            if rest and not defines(file, rest):
                return f"{'.'.join(rest)} is not defined in {file}"
            return None
    return f"no module {parts[0]}"


def named_problem(path: str, name: str) -> str | None:
    """Why ``name`` is not defined in the module ``path`` names (rule 3, second and third forms)."""
    files = [f for f in modules_ending(path) if f.endswith(".py")]
    if not files:
        return None  # rule 2 reports the path
    if any(defines(f, name.split(".")) for f in files):
        return None
    return f"{name} is not defined in {' or '.join(files)}"


def code_like(name: str) -> bool:
    return bool(re.search(r"[A-Z_.]", name))


# ---- the pages ------------------------------------------------------------------------------


def problems(page: Path, name: str | None = None) -> Iterator[str]:
    """Each reference of ``page`` that does not resolve, as ``name:line: what: why``."""
    text = page.read_text()
    body = prose(text)
    cited = recorded(body)
    name = name or page.relative_to(REPO_ROOT).as_posix()

    def where(offset: int) -> str:
        return f"{name}:{body.count(chr(10), 0, offset) + 1}"

    for link in LINK.finditer(body):
        target = link.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            yield f"{where(link.start())}: link to {target}: {file} does not exist"
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            yield f"{where(link.start())}: link to {target}: no heading #{anchor} in {dest.name}"
    for span in SPAN.finditer(cited):
        code = span.group(1).strip()
        if " " in code:
            continue
        if "::" in code:  # a pytest node id: the file, and the test (or class) in it
            code, _, test = code.partition("::")
            why = path_problem(code) or named_problem(code, test.split("::")[0].split("[")[0])
            if why:
                yield f"{where(span.start())}: `{span.group(1)}`: {why}"
            continue
        why = path_problem(code) if ("/" in code or code.endswith(".py")) else None
        if why is None and DOTTED.fullmatch(code) and not EXTENSIONS.search(code):
            why = dotted_problem(code)
        if why:
            yield f"{where(span.start())}: `{code}`: {why}"
    after_path = set()
    for match in PATH_THEN_NAME.finditer(cited):
        after_path.add(match.start(2))
        why = named_problem(match.group(1), match.group(2))
        if why:
            yield f"{where(match.start())}: `{match.group(1)}` `{match.group(2)}`: {why}"
    for match in NAME_THEN_PATH.finditer(cited):
        # `a.py`'s `Name` (`b.py`): the name is a.py's; the parentheses say something else
        if code_like(match.group(1)) and match.start(1) not in after_path:
            why = named_problem(match.group(2), match.group(1))
            if why:
                yield f"{where(match.start())}: `{match.group(1)}` (`{match.group(2)}`): {why}"
    for block in FENCE.finditer(recorded(text)):
        for word in FENCED_PATH.finditer(block.group(0)):
            why = path_problem(word.group(1))
            if why:
                yield f"{where(block.start())}: code block: {word.group(1)}: {why}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_link_path_and_symbol_resolves(page: Path) -> None:
    found = list(problems(page))
    assert not found, "\n".join(found)


# ---- the checker itself, on pages written for it --------------------------------------------


def check(tmp_path: Path, text: str) -> list[str]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return [line.split(": ", 1)[1] for line in problems(page, "page.md")]


def test_the_checker_finds_what_is_gone(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        "# Title\n\n[a](#title) [b](#nowhere) [c](missing.md) [d](https://example.com/x)\n"
        "`worker/scheduler/groups.py`, `scheduler/groups.py`, `worker/queue/held.py`.\n"
        "`worker.queue.consumer.envelope`, `worker.queue.held.envelope`, `producer.pipeline`.\n"
        "`producer/client.py` `Client.enqueue`, `producer/client.py` `Client.no_such_method`.\n"
        "`Scheduler._compile_grammar` (`worker/scheduler/scheduler.py`), `radixq` (`radixq/cli.py`).\n"
        "`benchmarks/NAME.py`, `configs/*.toml`, `worker/{attention,kvcache}/names.py`\n"
        "```\npython benchmarks/no_such_bench.py --x\npython benchmarks/floor.py\n```\n"
        f"{GONE}\nthe removed `benchmarks/cascade.py` and `worker.forward.PrefixGroups`; [x](#nowhere)\n\n"
        "`worker.LLM` (lazy, in `__all__`), `tests/unit/test_docs.py::test_slugs_*`.\n",
    )
    assert found == [
        "link to #nowhere: no heading #nowhere in page.md",
        "link to missing.md: missing.md does not exist",
        "link to #nowhere: no heading #nowhere in page.md",  # in the GONE paragraph: links still count
        "`worker/scheduler/groups.py`: worker/scheduler/groups.py does not exist",
        "`scheduler/groups.py`: no file of the repository ends with scheduler/groups.py",
        "`worker.queue.consumer.envelope`: envelope is not defined in worker/queue/consumer.py",
        "`producer/client.py` `Client.no_such_method`: Client.no_such_method is not defined in "
        "producer/client.py",
        "`Scheduler._compile_grammar` (`worker/scheduler/scheduler.py`): Scheduler._compile_grammar "
        "is not defined in worker/scheduler/scheduler.py",
        "code block: benchmarks/no_such_bench.py: benchmarks/no_such_bench.py does not exist",
    ]


def test_slugs_follow_github() -> None:
    assert slug("Progress, status and metrics") == "progress-status-and-metrics"
    assert slug("`radixq cancel`: stop work") == "radixq-cancel-stop-work"
    assert (
        slug("Tensor parallelism: several GPUs for one model")
        == "tensor-parallelism-several-gpus-for-one-model"
    )
