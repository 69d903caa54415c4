#!/usr/bin/env bash
# Runs the README's Quick start commands, exactly as written, in a fresh Debian 12 (bookworm)
# minbase chroot, so a missing package or a step that only works on a developer's machine shows
# up before a user meets it. Needs root, debootstrap and network access to the Debian mirror.
set -euo pipefail
# The whole script is one { } group: bash reads it all before running it, so editing or checking
# out this file while a check runs (they take an hour) cannot change what that check does.
{

usage() {
  cat <<'EOF'
Usage: tools/fresh_machine_check.sh [--only quickstart|test] [--keep] [--dir DIR]
                                    [--cache TARBALL] [--log FILE] [--mirror URL]

Debootstraps Debian 12 (bookworm, --variant=minbase, plus git and ca-certificates) into a new
temporary folder, clones this repository's HEAD into it (git clone: only COMMITTED files count;
uncommitted edits are not seen), mounts /proc, /sys, /dev (with /dev/pts) and, when the host has
it, the real target of /usr/local/cuda read-only, then runs the commands of README.md's Quick
start block inside the chroot as root, one after the other, each timed, and prints a summary.
On exit every mount is undone and the chroot is removed (it is never removed while anything is
still mounted under it).

  --only NAME      run only the README command whose script is NAME (quickstart or test)
  --keep           keep the chroot folder afterwards (mounts are still undone); prints its path
  --dir DIR        parent folder for the chroot and the log (default /var/tmp)
  --cache TARBALL  base chroot tarball: made by the first run, unpacked by later ones (saves the
                   debootstrap, ~40 s); every check still starts from a pristine copy
  --log FILE       log of everything the commands print (default DIR/vlac-fresh-DATE.log)
  --mirror URL     Debian mirror (default http://deb.debian.org/debian)

Exit status: 0 when every command ran exits 0, 1 when one failed, 2 for bad usage or setup.
EOF
}

only="" keep=0 parent=/var/tmp cache="" log="" mirror=http://deb.debian.org/debian
while (($#)); do
  case "$1" in
    --only) only=${2:?--only needs quickstart or test}; shift 2 ;;
    --keep) keep=1; shift ;;
    --dir) parent=${2:?--dir needs a folder}; shift 2 ;;
    --cache) cache=${2:?--cache needs a file}; shift 2 ;;
    --log) log=${2:?--log needs a file}; shift 2 ;;
    --mirror) mirror=${2:?--mirror needs a URL}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fresh_machine_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in ""|quickstart|test) ;; *) echo "fresh_machine_check: --only takes quickstart or test, not '$only'" >&2; exit 2 ;; esac
[[ $(id -u) -eq 0 ]] || { echo "fresh_machine_check: needs root (chroot, mount, debootstrap)" >&2; exit 2; }
for t in debootstrap chroot mount umount findmnt git tar; do
  command -v "$t" >/dev/null || { echo "fresh_machine_check: '$t' is missing (Debian: apt-get install debootstrap util-linux git tar)" >&2; exit 2; }
done

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
head=$(git -C "$repo" rev-parse HEAD)
mkdir -p "$parent"
parent=$(cd "$parent" && pwd -P)
[[ -n "$log" ]] || log="$parent/vlac-fresh-$(date -u +%Y%m%dT%H%M%SZ).log"
: >"$log"
root=$(mktemp -d "$parent/vlac-fresh.XXXXXX")
root=$(cd "$root" && pwd -P)
[[ "$root" == "$parent"/vlac-fresh.* && "$root" != / ]] || { echo "fresh_machine_check: odd chroot path '$root'" >&2; exit 2; }

say() { echo "fresh_machine_check: $*" | tee -a "$log" >&2; }

# Mount points at or below the chroot, deepest first (mountinfo's 5th field, octal escapes kept:
# mktemp names have no spaces).
# shellcheck disable=SC2317
mounts_under_root() {
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r -u
}

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local rc=$? p pid left
  trap - EXIT INT TERM
  # Processes still running inside the chroot (a daemon apt started, a stuck test) would keep
  # files open; end them by id.
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    if [[ "$(readlink "$p/root" 2>/dev/null)" == "$root" ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  for m in $(mounts_under_root); do umount -l "$m" 2>/dev/null || umount -l "$(printf '%b' "$m")" 2>/dev/null || true; done
  left=$(mounts_under_root)
  if [[ -n "$left" ]]; then
    say "still mounted under $root, NOT removing it:"; echo "$left" | tee -a "$log" >&2
    exit 2
  fi
  if [[ -d "$root/usr/local/cuda" ]] && [[ -n "$(find "$root/usr/local/cuda" -mindepth 1 -print -quit 2>/dev/null)" ]]; then
    say "$root/usr/local/cuda is not empty after unmounting, NOT removing the chroot"; exit 2
  fi
  if ((keep)); then
    say "kept the chroot at $root (nothing mounted there)"
  else
    # --one-file-system: never cross into another file system, even if a mount appeared after
    # the check above.
    rm -rf --one-file-system "$root"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "repo $repo at $head ($(git -C "$repo" log -1 --format=%s "$head" | cut -c1-70))"
[[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ]] || say "note: the working tree has uncommitted changes; the check sees only HEAD"
say "chroot $root, log $log"

# 1. A pristine bookworm minbase with git and ca-certificates.
t0=$(date +%s.%N)
if [[ -n "$cache" && -s "$cache" ]]; then
  tar -C "$root" --numeric-owner -xpf "$cache"
  how="unpacked $cache"
else
  debootstrap --variant=minbase --include=git,ca-certificates bookworm "$root" "$mirror" >>"$log" 2>&1 \
    || { say "debootstrap failed (see $log)"; exit 2; }
  rm -f "$root"/var/cache/apt/archives/*.deb  # an installed system keeps no downloaded packages
  how="debootstrap --variant=minbase --include=git,ca-certificates bookworm"
  if [[ -n "$cache" ]]; then
    tar -C "$root" --numeric-owner -cpf "$cache.tmp" . && mv "$cache.tmp" "$cache"
    how+=", saved to $cache"
  fi
fi
# mktemp's 0700 (kept by a tarball made from it) would keep every user but root (apt's _apt)
# out of the chroot's /.
chmod 755 "$root"
t_base=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
say "base system in ${t_base} s ($how, $(du -sh --one-file-system "$root" | cut -f1))"

# 2. This repository's HEAD, by clone (no hard links into the host's object store).
git clone -q --no-hardlinks "$repo" "$root/root/vlac" >>"$log" 2>&1
git -C "$root/root/vlac" checkout -q --detach "$head"

# 3. What a real machine has mounted.
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# The network's own trust, like its DNS: where this host reaches the registries through a proxy
# that signs with a local CA (/usr/local/share/ca-certificates), a machine on that network has the
# same CA, and pip (whose own bundle lacks it) is pointed at the system bundle by PIP_CERT below.
# No package is added: ca-certificates is part of the base system above.
cas=(/usr/local/share/ca-certificates/*.crt)
if [[ -e "${cas[0]}" ]]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -L "${cas[@]}" "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >>"$log" 2>&1 || say "update-ca-certificates failed in the chroot (see $log)"
  netenv=(PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
  say "copied this network's local CA certificates (${#cas[@]}) into the chroot"
else
  netenv=()
fi
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
if ! findmnt -n "$root/dev/pts" >/dev/null; then mount -t devpts devpts "$root/dev/pts"; fi
if [[ -e /usr/local/cuda ]]; then
  cuda=$(readlink -f /usr/local/cuda)
  mkdir -p "$root/usr/local/cuda"
  mount --bind "$cuda" "$root/usr/local/cuda"
  mount -o remount,bind,ro "$root/usr/local/cuda"
  say "bound $cuda read-only at /usr/local/cuda"
fi

# 4. The README's Quick start commands, exactly as written there.
mapfile -t cmds < <(awk '/^## Quick start/{q=1; next} q && /^## /{exit}
  q && /^```/{if (b) exit; b=1; next} q && b {sub(/[ \t]*#.*$/, ""); if (length) print}' "$root/root/vlac/README.md")
((${#cmds[@]})) || { say "no commands found in README.md's Quick start block"; exit 2; }

names=() codes=() walls=() cpus=() rsss=() failed=0
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for c in "${cmds[@]}"; do
  name=$(basename "${c%% *}" .sh)
  [[ -z "$only" || "$name" == "$only" ]] || continue
  say "running '$c' in the chroot"
  echo "===== $c" >>"$log"
  tv="$root/.time-$name"
  timer=(); [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -v -o "$tv")
  s=$(date +%s.%N)
  set +e
  # A login-like environment: nothing from this shell leaks in except the terminal type (and the
  # network's CA bundle for pip, netenv above).
  "${timer[@]}" chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" "${netenv[@]}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /root/vlac && $c" >>"$log" 2>&1
  code=$?
  set -e
  wall=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b - a}')
  rss=$(awk -F': ' '/Maximum resident set size/{printf "%.0f MiB", $2 / 1024}' "$tv" 2>/dev/null || true)
  # CPU time says what the wall time would be on an idle machine; a shared one stretches the wall.
  cpu=$(awk -F': ' '/User time|System time/{t += $2} END{if (NR) printf "%.0f", t}' "$tv" 2>/dev/null || true)
  cat "$tv" >>"$log" 2>/dev/null || true
  names+=("$c") codes+=("$code") walls+=("$wall") cpus+=("${cpu:-?}") rsss+=("${rss:-?}")
  ((code == 0)) || failed=1
  say "'$c' exit $code after ${wall} s"
  if ((code != 0)); then say "last lines of the log:"; tail -n 25 "$log" >&2; fi
done
((${#names[@]})) || { say "no README command matches --only $only"; exit 2; }

{
  echo "summary (bookworm minbase chroot, $(nproc) cores, load average $load0 at start, $(cut -d' ' -f1-3 /proc/loadavg) at end, HEAD $head):"
  printf '  %-22s %6s s  (%s)\n' "base system" "$t_base" "$how"
  for i in "${!names[@]}"; do
    printf '  %-22s %6s s  exit %s  cpu (user+sys) %s s  max rss %s\n' "${names[$i]}" "${walls[$i]}" "${codes[$i]}" "${cpus[$i]}" "${rsss[$i]}"
  done
  echo "  log: $log"
} | tee -a "$log"
exit "$failed"
}
