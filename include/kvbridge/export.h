// KVB_EXPORT: marks the public API of libkvbridge.
//
// The library is compiled with -fvisibility=hidden and
// -fvisibility-inlines-hidden, so a symbol leaves libkvbridge.so only when
// its declaration in include/kvbridge/*.h carries KVB_EXPORT: a class
// (all its out-of-line members), or a free function. Everything under src/
// (namespace kvbridge::internal) stays inside the library; a ctest
// (cmake/check_exports.cmake) fails when anything else is exported, or when
// a public symbol is not.
//
// The attribute is the same for building and for using the library (ELF
// needs no import marker), and harmless in a static link.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define KVB_EXPORT [[gnu::visibility("default")]]
#else
#define KVB_EXPORT
#endif
