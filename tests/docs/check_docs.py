#!/usr/bin/env python3
"""Documentation checks (CTest label docs), Python 3 standard library only.

  check_docs.py links  ROOT [--planted]   every relative link in ROOT/README.md
                                          and ROOT/docs/**/*.md points to an
                                          existing file, and every #anchor to a
                                          heading of its target (GitHub's slugs)
  check_docs.py stats  ROOT [--planted]   every field of gma_stats_t, gma_stat_t,
                                          gma_stream_stats_t and
                                          gma_graph_pool_stats_t (parsed from
                                          ROOT/include/gma.h) appears, in
                                          backticks, in ROOT/docs/stats.md
  check_docs.py errors ROOT [--planted]   every status of GMA_STATUS_MAP in
                                          ROOT/include/gma.h appears, in
                                          backticks, in ROOT/docs/errors.md

Without --planted: exit 0 when the check passes, 1 with one line per problem.
With --planted: the check must pass on the real files and fail on each planted
variant (a link to a missing file, to a missing heading, a linked page or
heading removed; each field or status removed from its page in turn, a field
or status added to the header); exit 0 when it does, 1 naming the variant the
check let through. A check that cannot fail proves nothing.
"""
import os
import re
import sys

# ---------------------------------------------------------------- markdown --

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the target ends at a space (a title
# follows) or the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading):
    """GitHub's anchor for a heading: markdown emphasis and code marks and
    link targets dropped, lower case, punctuation other than - and _
    removed, spaces to hyphens."""
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    h = h.replace("`", "").replace("*", "")
    h = h.strip().lower()
    h = "".join(c for c in h if c.isalnum() or c in " -_")
    return h.replace(" ", "-")


def anchors(text):
    """The anchors of a page's headings, with GitHub's -1, -2 for repeats."""
    seen = {}
    out = set()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        if s in seen:
            seen[s] += 1
            out.add("%s-%d" % (s, seen[s]))
        else:
            seen[s] = 0
            out.add(s)
    return out


def links(text):
    """(line number, target) of every link outside code."""
    for n, line in prose_lines(text):
        line = CODE_SPAN.sub("", line)
        for m in LINK.finditer(line):
            yield n, m.group(1)


def is_external(target):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None or target.startswith("//")


def markdown_pages(root):
    """README.md and docs/**/*.md, relative to root."""
    pages = ["README.md"] if os.path.isfile(os.path.join(root, "README.md")) else []
    for d, _, files in os.walk(os.path.join(root, "docs")):
        for f in sorted(files):
            if f.endswith(".md"):
                pages.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(pages)


class Tree:
    """The repository's files as the check sees them: the real ones, with
    pages replaced (text) or removed (None) by a planted variant."""

    def __init__(self, root, override=None):
        self.root = root
        self.override = override or {}

    def exists(self, rel):
        rel = os.path.normpath(rel)
        if rel in self.override:
            return self.override[rel] is not None
        return os.path.exists(os.path.join(self.root, rel))

    def text(self, rel):
        rel = os.path.normpath(rel)
        if rel in self.override:
            return self.override[rel]
        with open(os.path.join(self.root, rel), encoding="utf-8") as f:
            return f.read()

    def pages(self):
        real = [p for p in markdown_pages(self.root) if self.exists(p)]
        extra = [p for p, t in self.override.items() if t is not None and p not in real]
        return sorted(real + extra)


def check_links(tree):
    problems = []
    anchor_cache = {}
    for page in tree.pages():
        base = os.path.dirname(page)
        for n, target in links(tree.text(page)):
            if is_external(target):
                continue
            path, _, anchor = target.partition("#")
            rel = os.path.normpath(os.path.join(base, path)) if path else page
            if path and not tree.exists(rel):
                problems.append("%s:%d: link to %s: no such file" % (page, n, target))
                continue
            if anchor and rel.endswith(".md"):
                if rel not in anchor_cache:
                    anchor_cache[rel] = anchors(tree.text(rel))
                if anchor not in anchor_cache[rel]:
                    problems.append("%s:%d: link to %s: %s has no heading with anchor #%s"
                                    % (page, n, target, rel, anchor))
    return problems


def planted_links(root):
    tree = Tree(root)
    real = check_links(tree)
    if real:
        return ["the real pages fail the check:"] + real
    pages = tree.pages()
    first = "README.md" if "README.md" in pages else pages[0]
    variants = []
    text = tree.text(first)
    variants.append(("a link to a missing file",
                     {first: text + "\n[gone](docs/no-such-page.md)\n"}))
    variants.append(("a link to a missing heading of the same page",
                     {first: text + "\n[gone](#no-such-heading)\n"}))
    # A real link with an anchor: remove its target's heading; a real link
    # to a page: remove the page.
    anchored = page_link = None
    for page in pages:
        base = os.path.dirname(page)
        for n, target in links(tree.text(page)):
            if is_external(target):
                continue
            path, _, anchor = target.partition("#")
            rel = os.path.normpath(os.path.join(base, path)) if path else page
            if anchor and rel.endswith(".md") and anchored is None:
                anchored = (page, target, rel, anchor)
            if path and rel.endswith(".md") and rel != page and page_link is None:
                page_link = (page, target, rel)
    if anchored is None or page_link is None:
        return ["no link with an anchor, or no link to another page, to plant against"]
    page, target, rel, anchor = anchored
    kept = []
    for line in tree.text(rel).split("\n"):
        m = HEADING.match(line)
        if m and slug(m.group(2)) == anchor:
            continue  # the heading removed
        kept.append(line)
    variants.append(("the heading of %s's link %s removed" % (page, target),
                     {rel: "\n".join(kept)}))
    page, target, rel = page_link
    variants.append(("%s, which %s links to (%s), removed" % (rel, page, target), {rel: None}))
    let_through = [name for name, override in variants if not check_links(Tree(root, override))]
    return ["the check passed with %s" % v for v in let_through]


# ------------------------------------------------------------------ header --

def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def struct_fields(header, name):
    """The field names of `typedef struct ... { ... } name;` in header."""
    text = strip_c_comments(header)
    m = re.search(r"typedef\s+struct\s+\w*\s*\{([^{}]*)\}\s*" + re.escape(name) + r"\s*;", text)
    if not m:
        raise ValueError("no struct %s in gma.h" % name)
    fields = []
    for decl in m.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        # "uint64_t a, b" or "char trace_path[512]" or "gma_stat_t allocated"
        words = re.match(r"^(?:const\s+)?[\w\s\*]+?\s*\**\s*(\w+(?:\s*\[[^\]]*\])?(?:\s*,\s*\**\s*\w+(?:\s*\[[^\]]*\])?)*)$",
                         decl, re.S)
        if not words:
            raise ValueError("cannot read the declaration '%s' of %s" % (decl, name))
        for part in words.group(1).split(","):
            fields.append(re.sub(r"\[.*\]", "", part).strip(" *"))
    return fields


def statuses(header):
    """The names of GMA_STATUS_MAP's X(...) entries."""
    m = re.search(r"#define\s+GMA_STATUS_MAP\(X\)(.*?)\n\s*\n", header, re.S)
    if not m:
        raise ValueError("no GMA_STATUS_MAP in gma.h")
    names = re.findall(r"\bX\(\s*(GMA_\w+)\s*,", m.group(1))
    if not names:
        raise ValueError("GMA_STATUS_MAP has no X(...) entries")
    return names


def missing_in_page(names, page_text):
    """The names that do not appear in backticks (`name`, or inside a code
    span such as `gma_stats_t.name`) in the page."""
    spans = set()
    for m in CODE_SPAN.finditer(page_text):
        spans.update(re.findall(r"\w+", m.group(2)))
    return [n for n in names if n not in spans]


STATS_STRUCTS = ("gma_stats_t", "gma_stat_t", "gma_stream_stats_t", "gma_graph_pool_stats_t")


def stats_names(header):
    out = []
    for s in STATS_STRUCTS:
        out += [(s, f) for f in struct_fields(header, s)]
    return out


def check_names(pairs, page_text, page, what):
    miss = missing_in_page([n for _, n in pairs], page_text)
    owner = dict((n, s) for s, n in pairs)
    return ["%s: %s %s (%s) does not appear in backticks" % (page, what, n, owner[n]) for n in miss]


def remove_name(page_text, name):
    """The page with every backticked mention of name taken out."""
    def drop(m):
        inner = re.sub(r"\b%s\b" % re.escape(name), "", m.group(2))
        return m.group(1) + inner + m.group(1) if inner.strip() else ""
    return CODE_SPAN.sub(drop, page_text)


def planted_names(pairs, page_text, page, what):
    if check_names(pairs, page_text, page, what):
        return ["the real page fails the check:"] + check_names(pairs, page_text, page, what)
    let_through = []
    for owner, name in pairs:
        if not check_names(pairs, remove_name(page_text, name), page, what):
            let_through.append("%s removed from %s" % (name, page))
    if not check_names(pairs + [("gma.h", "no_such_name_in_the_page")], page_text, page, what):
        let_through.append("a %s added to gma.h" % what)
    return ["the check passed with %s" % v for v in let_through]


# -------------------------------------------------------------------- main --

def main(argv):
    planted = "--planted" in argv
    args = [a for a in argv if a != "--planted"]
    if len(args) != 2 or args[0] not in ("links", "stats", "errors"):
        sys.stderr.write(__doc__)
        return 2
    what, root = args
    if what == "links":
        problems = planted_links(root) if planted else check_links(Tree(root))
        summary = "%d pages" % len(markdown_pages(root))
    else:
        with open(os.path.join(root, "include", "gma.h"), encoding="utf-8") as f:
            header = f.read()
        if what == "stats":
            pairs, page, kind = stats_names(header), "docs/stats.md", "field"
            if len([1 for s, _ in pairs if s == "gma_stats_t"]) < 50:
                print("gma.h: gma_stats_t parsed to fewer than 50 fields: the parser is broken")
                return 1
        else:
            pairs, page, kind = [("GMA_STATUS_MAP", n) for n in statuses(header)], "docs/errors.md", "status"
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = f.read()
        problems = planted_names(pairs, text, page, kind) if planted else check_names(pairs, text, page, kind)
        summary = "%d %s of gma.h against %s" % (len(pairs), "fields" if kind == "field" else "statuses", page)
    for p in problems:
        print(p)
    if planted:
        print("planted (%s, %s): %s" % (what, summary,
              "every variant was caught" if not problems else "%d variants let through" % len(problems)))
    else:
        print("%s (%s): %s" % (what, summary, "ok" if not problems else "%d problems" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
