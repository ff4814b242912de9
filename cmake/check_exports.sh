#!/usr/bin/env bash
# Checks what libkvbridge.so exports (run by ctest as lib.exports):
#  1. nothing but the public API: every dynamic symbol is in namespace
#     kvbridge (a class or function of include/kvbridge/), none in
#     kvbridge::internal, an anonymous namespace or a pimpl (::Impl);
#  2. all of it: every global, non-inline kvbridge:: symbol of the static
#     internals outside kvbridge::internal (i.e. what a public header
#     declares) is exported, so a missing KVB_EXPORT fails here, not in a
#     user's link;
#  3. no program of the project links libkvbridge.so (they link the static
#     internals): one process never holds two copies of the library's
#     globals (logger, registries).
# Usage: check_exports.sh NM READELF SHARED_LIB STATIC_LIB [PROGRAM...]
set -euo pipefail
nm=$1 readelf=$2 shared=$3 static=$4
shift 4

# Demangled names only ("ADDR TYPE NAME..." -> "TYPE NAME..."), one a line.
exported=$("$nm" -D --defined-only -C "$shared" | cut -d' ' -f2- | sort -u)
[ -n "$exported" ] || { echo "FAIL: $shared exports nothing"; exit 1; }

# The qualified name of a symbol, without its parameter list: what decides
# where it belongs (parameters may name internal types).
qualified() { sed -e 's/(anonymous namespace)/ANONYMOUS/g' -e 's/(.*$//'; }

fail=0
# The few names the linker itself defines in a shared object.
bad=$(cut -d' ' -f2- <<<"$exported" |
      grep -Ev '^(_init|_fini|_edata|_end|__bss_start)$' |
      qualified |
      grep -Ev '^((typeinfo|typeinfo name|vtable) for )?kvbridge::' || true)
internal=$(cut -d' ' -f2- <<<"$exported" | qualified |
           grep -E 'kvbridge::internal::|ANONYMOUS|::Impl::' || true)
if [ -n "$bad$internal" ]; then
  echo "FAIL: $shared exports symbols outside the public API:"
  printf '%s\n%s\n' "$bad" "$internal" | sed '/^$/d; s/^/  /' | head -50
  fail=1
fi

# Strong global symbols (T: code, D/B/R: data) of the static internals that
# belong to the public namespace; weak ones (W, V: inline functions,
# templates) are the user's to instantiate.
public=$("$nm" -C --defined-only --extern-only "$static" 2>/dev/null |
         awk '$2 ~ /^[TDBR]$/' | cut -d' ' -f3- |
         grep -E '^kvbridge::' | grep -Ev '^kvbridge::internal::' |
         grep -v '(anonymous namespace)' | grep -v '::Impl::' | sort -u || true)
missing=$(comm -23 <(printf '%s\n' "$public" | sed '/^$/d') \
                   <(cut -d' ' -f2- <<<"$exported" | sort -u))
if [ -n "$missing" ]; then
  echo "FAIL: public symbols not exported (a declaration in include/kvbridge/ lacks KVB_EXPORT?):"
  sed 's/^/  /' <<<"$missing" | head -50
  fail=1
fi

lib=$(basename "$shared")
lib=${lib%%.so*}.so
for prog in "$@"; do
  if [ ! -f "$prog" ]; then
    echo "FAIL: $prog not built"
    fail=1
    continue
  fi
  if "$readelf" -d "$prog" | grep -F "NEEDED" | grep -qF "[$lib"; then
    echo "FAIL: $prog links $lib and the static internals: two copies of the library's globals"
    fail=1
  fi
done

if [ "$fail" -eq 0 ]; then
  echo "OK: $(wc -l <<<"$exported") symbols exported, all public; $(wc -l <<<"$public") public" \
       "symbols in the internals, all exported; $# programs without $lib"
fi
exit "$fail"
