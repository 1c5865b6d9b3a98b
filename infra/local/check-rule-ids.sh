#!/usr/bin/env bash
# Checks that every delivery rule ID the repository uses (G1, R4, L5, ...) is defined in
# docs/delivery-rules.md, so that anyone with a clone can look each one up. Run by `make test`
# (infra/local/test.sh); runs from any directory.
#
# Used: the IDs found in the files git tracks with these extensions: .rs .sh .ts .yaml .yml
# .toml .md .py (Cargo.lock has none of them; docs/delivery-rules.md itself is left out), in
# two forms:
#   - an uppercase ID as a whole word: a letter of GBSRDLFHCPAO and one or two digits, e.g. in
#     doc comments ("/// R1, S5: ...") and in the README. Case-sensitive, and grep -w counts
#     letters, digits and '_' as word characters, so identifiers that merely contain an ID
#     (S3ObjectStore, S3_MANAGED, EC2) and hex or base64 fragments do not match.
#   - a lowercase ID at the start or the end of a Rust function's name, as tests name the
#     rules they cover (`fn late_success_cancels_the_pending_retry_r4`,
#     `fn l5_retries_for_four_hours_then_drops`): each `_`-separated word of the leading and
#     trailing runs that is a letter of gbsrdlfhcpao and one digit 1-9. One digit only, so Rust's
#     float types in names such as serde's `visit_f64` do not count; variables (`h1_port`)
#     and words inside a name (`..._parses_s3_urls_...`) are not read.
# Known false positive, left in on purpose: S3 is also the AWS object store ("an S3 bucket",
# `AWS::S3::Bucket`, `fn s3_client`). It is the same token as the status rule S3, which is
# defined, so it cannot make the check fail; telling the two apart by context would be
# guesswork. If another non-rule word ever matches (a product name, an HTTP version), the
# output names the file and line: reword it there, or exclude that exact word here, with why.
#
# Defined: an ID that opens a heading of docs/delivery-rules.md, as in `### R4: ...`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
rules=docs/delivery-rules.md

[[ -f $rules ]] || { echo "check-rule-ids: $rules is missing" >&2; exit 1; }

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  while IFS= read -r -d '' f; do
    if [[ -f $f ]]; then files+=("$f"); fi # tracked but deleted in the work tree: skipped
  done < <(git ls-files -z -- '*.rs' '*.sh' '*.ts' '*.yaml' '*.yml' '*.toml' '*.md' '*.py' \
    ":(exclude)$rules" ':(exclude)Cargo.lock')
else
  # Not a git checkout (an unpacked archive): the same files, found by name.
  while IFS= read -r -d '' f; do
    files+=("${f#./}")
  done < <(find . \( -name target -o -name node_modules -o -name '.venv*' -o -name .git \
    -o -name cdk.out -o -name .aws-sam \) -prune -o -type f \
    \( -name '*.rs' -o -name '*.sh' -o -name '*.ts' -o -name '*.yaml' -o -name '*.yml' \
    -o -name '*.toml' -o -name '*.md' -o -name '*.py' \) ! -path "./$rules" -print0)
fi

# grep over NUL-separated file names on stdin, with the file name and line of each match;
# finding nothing in some file is not an error (xargs says 123 for any grep that exited 1 or
# 2; a file that cannot be read has already said so on stderr).
scan() {
  local status=0
  xargs -0 -r grep -Hn "$@" || status=$?
  ((status == 0 || status == 123)) || return "$status"
}

# "ID file:line", one line per use.
used=$(
  {
    printf '%s\0' "${files[@]}" | scan -owE '[GBSRDLFHCPAO][0-9]{1,2}' |
      awk -F: '{ print $3, $1 ":" $2 }'
    printf '%s\0' "${files[@]}" | { grep -z '\.rs$' || true; } | scan -oE '\bfn [a-z][a-z0-9_]*' |
      awk -F: '
        function id(w) { return w ~ /^[gbsrdlfhcpao][1-9]$/ }
        {
          name = substr($3, 4); n = split(name, w, "_")
          for (i = 1; i <= n && id(w[i]); i++) print toupper(w[i]), $1 ":" $2
          for (j = n; j >= i && id(w[j]); j--) print toupper(w[j]), $1 ":" $2
        }'
  } | sort -k1,1 -k2,2V -u
)

defined=$(grep -oE '^#+ +[GBSRDLFHCPAO][0-9]{1,2}:' "$rules" | grep -oE '[GBSRDLFHCPAO][0-9]{1,2}' | sort -u || true)

undefined=$(
  awk -v defined="$defined" '
    BEGIN { n = split(defined, d, "\n"); for (i = 1; i <= n; i++) ok[d[i]] = 1 }
    NF && !($1 in ok) {
      count[$1]++
      if (count[$1] <= 3) places[$1] = places[$1] (count[$1] > 1 ? ", " : "") $2
      if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 }
    }
    END {
      for (i = 1; i <= k; i++) {
        u = order[i]; more = count[u] > 3 ? sprintf(" and %d more", count[u] - 3) : ""
        printf "  %s: %s%s\n", u, places[u], more
      }
    }' <<<"$used"
)

if [[ -n $undefined ]]; then
  echo "rule IDs used but not defined in $rules (add a heading such as '### R4: ...' there, or fix the ID):" >&2
  echo "$undefined" >&2
  exit 1
fi
count=$(awk 'NF { print $1 }' <<<"$used" | sort -u | wc -l)
echo "rule IDs: $count used, all defined in $rules"
