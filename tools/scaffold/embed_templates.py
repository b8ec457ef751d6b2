#!/usr/bin/env python3
"""Embeds the plugin project templates (sdk/templates/) into a C++ header, for `keel plugins new`.

Usage: embed_templates.py TEMPLATE_DIR OUTPUT DEPFILE

OUTPUT declares keel::scaffold::kTemplates, one {path, text} per file under TEMPLATE_DIR (path
relative to it, '/'-separated, sorted; files and directories whose names start with '.' or end
with '~' are left out). DEPFILE names every file and directory read, so that ninja embeds again
when a template changes or one is added.
"""
import os
import sys

DELIMITER = "keel_template"


def main(root, output, depfile):
    files, dirs = [], [root]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.endswith("~"))
        dirs += [os.path.join(dirpath, d) for d in dirnames]
        files += [os.path.join(dirpath, f) for f in sorted(filenames)
                  if not f.startswith(".") and not f.endswith("~")]
    files.sort(key=lambda f: os.path.relpath(f, root))
    out = [
        "// Generated from sdk/templates/ by tools/scaffold/embed_templates.py: do not edit.",
        "#pragma once",
        "",
        "namespace keel::scaffold {",
        "",
        "struct Template {",
        "  const char* path;  // relative to sdk/templates/",
        "  const char* text;",
        "};",
        "",
        "inline constexpr Template kTemplates[] = {",
    ]
    for f in files:
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        if ")" + DELIMITER + '"' in text:
            sys.exit(f"{f}: holds the raw-string delimiter ){DELIMITER}\"; rename it in {__file__}")
        rel = os.path.relpath(f, root).replace(os.sep, "/")
        out.append(f'    {{"{rel}", R"{DELIMITER}({text}){DELIMITER}"}},')
    out += ["};", "", "}  // namespace keel::scaffold", ""]
    with open(output, "w", encoding="utf-8") as fh:
        fh.write("\n".join(out))
    esc = lambda p: p.replace("\\", "\\\\").replace(" ", "\\ ").replace("$", "$$")
    with open(depfile, "w", encoding="utf-8") as fh:
        fh.write(esc(output) + ": " + " ".join(esc(p) for p in files + dirs) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
