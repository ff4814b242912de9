#!/usr/bin/env python3
"""The function half of the size rule (issue 10): no function under src/ over
80 lines.

clang-format puts a function defined at namespace scope in a .cc file on
lines that start in column 0 and closes it with a "}" alone in column 0, so
a definition is a column-0 line that is not a comment, preprocessor line,
namespace, class or declaration, followed by an opening "{" that ends a
line, up to the next column-0 "}". What is counted is the body: the lines
between the line that opens it and the line that closes it, as clang-tidy's
readability-function-size counts them. Lambdas and local classes count
towards the function that holds them.

Prints every function over the limit (file:line, name, lines) and exits 1
when there is one; exit 2 when a file cannot be read as described (an
opening without its close), so a format change cannot hide a long function.
"""
import pathlib
import re
import subprocess
import sys

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 80
# Files to check (relative to the checkout or absolute); default: src/*.cc.
FILES = sys.argv[2:]
ROOT = pathlib.Path(__file__).resolve().parent.parent
NOT_A_FUNCTION = re.compile(
    r"^(#|//|/\*|\*|namespace\b|}|class\b|struct\b|enum\b|union\b|using\b|"
    r"typedef\b|extern\b|static_assert\b|template\s*<[^>]*>\s*$|INSTANTIATE)")


def functions(path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or line[0].isspace() or NOT_A_FUNCTION.match(line):
            i += 1
            continue
        # A declaration or definition starts here: find where it opens.
        start = i
        j = i
        # The signature: its first line in column 0, the rest indented.
        while j < len(lines) and not lines[j].rstrip().endswith("{"):
            text = lines[j].rstrip()
            if (text.endswith(";") or text.endswith("}") or not text
                    or (j > start and not text[0].isspace())):
                break
            j += 1
        if (j >= len(lines) or not lines[j].rstrip().endswith("{")
                or "(" not in "".join(lines[start:j + 1])):
            i = max(j, start + 1)
            continue
        # An initializer (`const Foo kBar = {`) is not a function.
        head = " ".join(s.strip() for s in lines[start:j + 1])
        if re.search(r"=\s*\{$", head) or re.search(r"\)\s*=", head.split("{")[0]):
            i = j + 1
            continue
        k = j + 1
        while k < len(lines) and lines[k] != "}":
            if lines[k] and not lines[k][0].isspace() and not lines[k].startswith("#"):
                # Something in column 0 inside a body: not clang-format's shape.
                if not lines[k].startswith("//"):
                    raise ValueError(f"{path}:{k + 1}: column-0 line inside the body "
                                     f"that opened at line {j + 1}")
            k += 1
        if k >= len(lines):
            raise ValueError(f"{path}:{start + 1}: no closing '}}' in column 0")
        name = re.sub(r"\s+", " ", head.rsplit("{", 1)[0]).strip()[:100]
        yield start + 1, name, k - j - 1
        i = k + 1


def main():
    files = FILES or subprocess.run(["git", "ls-files", "src/*.cc"], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.split()
    over = []
    count = 0
    try:
        for f in files:
            for line, name, n in functions(ROOT / f):
                count += 1
                if n > LIMIT:
                    over.append(f"{f}:{line}: {name}: {n} lines")
    except ValueError as e:
        print(f"cannot check function sizes: {e}")
        return 2
    if over:
        print(f"functions over {LIMIT} lines (of {count} in {len(files)} files):")
        print("\n".join(over))
        return 1
    print(f"every function has <= {LIMIT} lines ({count} functions in {len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
