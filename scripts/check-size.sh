#!/usr/bin/env bash
# Size check of every Rust file of the repository: the sources (driver/src, app/src, nvmf/src,
# hw-tests/src, the driver's build.rs, and fio-engine: the fio engine's src and build.rs),
# the integration tests (driver/tests, app/tests, nvmf/tests, hw-tests/tests), the fuzz
# targets (fuzz/fuzz_targets) and the driver's benchmarks and examples (driver/benches,
# driver/examples). No file over 800 lines, no function over 80 lines, so that a module
# reads as a few ideas and a function in one screen.
#
# A function that must stay one piece (a match that is a table, one per opcode; a hot
# loop kept whole for the code it compiles to) says why in a comment right above it,
# among its doc comments and attributes:
#
#     // one piece: <why>
#
# Unit test files inside a tree it checks (`tests.rs`, files under a `tests/` folder below
# the folder named) and functions inside a `#[cfg(test)]` module are exempt; a folder of
# integration tests named itself (app/tests) is checked like any source. Usage:
# scripts/check-size.sh [DIR...] (default: the folders and files of `defaults` below). With
# the default list, a Rust file git tracks outside it is an offender too, so that a new
# folder of Rust code is added to the list rather than skipped. Exits 1 and lists every
# offender when one is found.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

MAX_FILE_LINES=${MAX_FILE_LINES:-800}
MAX_FN_LINES=${MAX_FN_LINES:-80}

defaults=(
    driver/src driver/build.rs app/src nvmf/src hw-tests/src fio-engine
    driver/tests app/tests nvmf/tests hw-tests/tests
    fuzz/fuzz_targets driver/benches driver/examples
)
dirs=("$@")
if ((${#dirs[@]} == 0)); then
    dirs=("${defaults[@]}")
    # Every Rust file git tracks must fall under the default list.
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        uncovered=()
        while IFS= read -r f; do
            covered=0
            for dir in "${dirs[@]}"; do
                if [[ $f == "$dir" || $f == "$dir"/* ]]; then
                    covered=1
                    break
                fi
            done
            ((covered)) || uncovered+=("$f")
        done < <(git ls-files '*.rs')
        if ((${#uncovered[@]} > 0)); then
            printf '%s: not checked: add its folder to the default list of scripts/check-size.sh\n' "${uncovered[@]}"
            echo "check-size: ${#uncovered[@]} Rust file(s) outside the default list" >&2
            exit 1
        fi
    fi
fi

files=()
for dir in "${dirs[@]}"; do
    dir=${dir%/}
    while IFS= read -r f; do
        # The path below the folder named: its own name (app/tests) does not exempt it.
        case "/${f#"$dir"/}" in
        */tests.rs | */tests/*) ;;
        *) files+=("$f") ;;
        esac
    done < <(find "$dir" -name '*.rs' -type f | sort)
done

if ((${#files[@]} == 0)); then
    echo "check-size: no Rust files under ${dirs[*]}" >&2
    exit 1
fi

# The scanner: strips comments, strings and char literals (state kept across lines),
# counts braces, and measures every `fn` item from its `fn` line to its closing brace (a
# `;` ends a bodiless `fn` only outside brackets: not the one of `[u8; 64]` in a signature).
# POSIX awk (mawk or gawk).
# shellcheck disable=SC2016 # the awk program is in single quotes on purpose
awk -v q="'" -v max_file="$MAX_FILE_LINES" -v max_fn="$MAX_FN_LINES" '
function reset_file() {
    depth = 0; in_block = 0; in_str = 0; in_raw = 0; raw_hashes = "";
    nfn = 0; pending = 0; one_piece = 0; test_depth = -1; cfg_test = 0;
}
function report_file(   n) {
    if (fname != "" && fline > max_file) {
        printf "%s: %d lines (limit %d): split it into modules by idea\n", fname, fline, max_file;
        bad++;
    }
}
# The code of line s with comments, strings and char literals blanked out.
function strip(s,   out, i, n, c, c2, j, endq) {
    out = ""; n = length(s); i = 1;
    while (i <= n) {
        c = substr(s, i, 1);
        if (in_block) {
            c2 = substr(s, i, 2);
            if (c2 == "*/") { in_block--; i += 2; continue; }
            if (c2 == "/*") { in_block++; i += 2; continue; }
            i++; continue;
        }
        if (in_str) {
            if (c == "\\") { i += 2; continue; }
            if (c == "\"") { in_str = 0; out = out "\"" }
            i++; continue;
        }
        if (in_raw) {
            endq = "\"" raw_hashes;
            if (substr(s, i, length(endq)) == endq) { in_raw = 0; i += length(endq); out = out "\""; continue; }
            i++; continue;
        }
        c2 = substr(s, i, 2);
        if (c2 == "//") break;
        if (c2 == "/*") { in_block = 1; i += 2; continue; }
        if ((c == "r" || c2 == "br") && (i == 1 || substr(s, i - 1, 1) !~ /[A-Za-z0-9_]/)) {
            j = (c == "r") ? i + 1 : i + 2;
            raw_hashes = "";
            while (substr(s, j, 1) == "#") { raw_hashes = raw_hashes "#"; j++; }
            if (substr(s, j, 1) == "\"") { in_raw = 1; out = out "\""; i = j + 1; continue; }
        }
        if (c == "\"") { in_str = 1; out = out "\""; i++; continue; }
        if (c == q) {
            if (substr(s, i + 1, 1) == "\\") {
                j = i + 2;
                while (j <= n && j < i + 12 && substr(s, j, 1) != q) j++;
                out = out q q; i = j + 1; continue;
            }
            if (substr(s, i + 2, 1) == q) { out = out q q; i += 3; continue; }
        }
        out = out c; i++;
    }
    return out;
}
FNR == 1 { report_file(); fname = FILENAME; reset_file(); }
{
    fline = FNR;
    raw = $0;
    code = strip(raw);
    # A "// one piece:" comment holds through the doc comments and attributes below it.
    if (raw ~ /^[ \t]*\/\/+!?[ \t]*one piece:/) { one_piece = 1; }
    else if (raw !~ /^[ \t]*(\/\/|#\[|#!\[)/ && code !~ /(^|[^A-Za-z0-9_])fn[ \t]+[A-Za-z_]/) { if (code !~ /^[ \t]*$/) one_piece = 0; }
    if (code ~ /#\[cfg\(test\)\]/) cfg_test = 1;
    if (code ~ /^[ \t]*(pub(\([^)]*\))?[ \t]+)?mod[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*\{/) {
        if ((cfg_test || code ~ /mod[ \t]+tests[ \t]*\{/) && test_depth < 0) test_depth = depth;
        cfg_test = 0;
    } else if (code !~ /^[ \t]*(#\[|$)/) {
        cfg_test = 0;
    }
    if (match(code, /(^|[^A-Za-z0-9_])fn[ \t]+[A-Za-z_][A-Za-z0-9_]*/)) {
        name = substr(code, RSTART, RLENGTH);
        sub(/^[^f]*fn[ \t]+/, "", name);
        pending = 1; nest = 0; p_name = name; p_line = FNR; p_depth = depth; p_exempt = one_piece;
        p_test = (test_depth >= 0);
        one_piece = 0;
    }
    n = length(code);
    for (i = 1; i <= n; i++) {
        c = substr(code, i, 1);
        if (pending && (c == "[" || c == "(")) { nest++; }
        else if (pending && (c == "]" || c == ")")) { nest--; }
        else if (c == ";" && pending && depth == p_depth && nest == 0) { pending = 0; }
        else if (c == "{") {
            if (pending && depth == p_depth) {
                nfn++; s_name[nfn] = p_name; s_line[nfn] = p_line; s_depth[nfn] = depth;
                s_exempt[nfn] = p_exempt || p_test;
                pending = 0;
            }
            depth++;
        } else if (c == "}") {
            depth--;
            if (nfn > 0 && depth == s_depth[nfn]) {
                len = FNR - s_line[nfn] + 1;
                if (len > max_fn && !s_exempt[nfn]) {
                    printf "%s:%d: fn %s is %d lines (limit %d): split it into named steps, or say why it is one piece with a \"// one piece: <why>\" comment above it\n", fname, s_line[nfn], s_name[nfn], len, max_fn;
                    bad++;
                }
                nfn--;
            }
            if (test_depth >= 0 && depth == test_depth) test_depth = -1;
        }
    }
}
END {
    report_file();
    if (bad > 0) {
        printf "check-size: %d offender(s)\n", bad;
        exit 1;
    }
}
' "${files[@]}"
