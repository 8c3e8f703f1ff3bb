# What libkvedge installs, decided at configure time: the public headers (copied to
# <build>/include/kvedge/ with their project includes rewritten to the installed names) and
# the check that clients/lib/kvedge.h carries the project's version.

# The only <...> headers an installed header may include: the C standard library's. Anything
# else would make every user of libkvedge depend on it.
set(KVEDGE_PUBLIC_SYSTEM_INCLUDES
    assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h
    math.h setjmp.h signal.h stdalign.h stdarg.h stdatomic.h stdbool.h stddef.h stdint.h
    stdio.h stdlib.h stdnoreturn.h string.h tgmath.h threads.h time.h uchar.h wchar.h
    wctype.h)

# kvedge_public_headers(OUT_VAR DIR HEADER...)
# HEADERs are paths from the source root ("access/codec/chunk.h"), the public set. Each is copied to
# DIR/kvedge/<its file name> with every `#include "a/b.h"` of a public header rewritten to
# `#include "kvedge/b.h"`; OUT_VAR receives the copies' paths. Configuring fails when a public
# header includes a project header outside the set, a non-standard system header, or a
# computed include, so the facade can never pull in an internal header unnoticed. Editing a
# public header re-runs the configure step; copies are rewritten only when they change.
function(kvedge_public_headers out_var dir)
    set(public ${ARGN})
    set(names)
    foreach(h IN LISTS public)
        get_filename_component(name "${h}" NAME)
        if(name IN_LIST names)
            message(FATAL_ERROR "public headers: two of them are named ${name}; installed "
                                "headers share one directory, names must be unique")
        endif()
        list(APPEND names "${name}")
    endforeach()

    set(outputs)
    foreach(h IN LISTS public)
        set(src "${PROJECT_SOURCE_DIR}/${h}")
        if(NOT EXISTS "${src}")
            message(FATAL_ERROR "public header ${h} does not exist")
        endif()
        set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${src}")
        file(READ "${src}" text)
        # A leading newline lets one pattern anchor every directive at a line start, the
        # first line's included; prose such as "#include <kvedge/kvedge.h>" in a comment
        # does not start a line and is left alone.
        set(text "\n${text}")
        string(REGEX MATCHALL "\n[ \t]*#[ \t]*include[^\n]*" directives "${text}")
        foreach(d IN LISTS directives)
            if(d MATCHES "^\n[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
                set(inc "${CMAKE_MATCH_1}")
                if(NOT inc IN_LIST public)
                    message(FATAL_ERROR
                        "public header ${h} includes \"${inc}\", which is not a public header: "
                        "add it to KVEDGE_PUBLIC_HEADERS (clients/CMakeLists.txt) and "
                        "clients/lib/libkvedge.map, or drop the include")
                endif()
                get_filename_component(name "${inc}" NAME)
                string(REPLACE "\"${inc}\"" "\"kvedge/${name}\"" line "${d}")
                string(REPLACE "${d}" "${line}" text "${text}")
            elseif(d MATCHES "^\n[ \t]*#[ \t]*include[ \t]*<([^>]+)>")
                if(NOT CMAKE_MATCH_1 IN_LIST KVEDGE_PUBLIC_SYSTEM_INCLUDES)
                    message(FATAL_ERROR
                        "public header ${h} includes <${CMAKE_MATCH_1}>: an installed header "
                        "may include only the C standard library's")
                endif()
            else()
                string(STRIP "${d}" d)
                message(FATAL_ERROR "public header ${h}: cannot check `${d}`")
            endif()
        endforeach()
        string(SUBSTRING "${text}" 1 -1 text)

        get_filename_component(name "${h}" NAME)
        set(out "${dir}/kvedge/${name}")
        set(old "")
        if(EXISTS "${out}")
            file(READ "${out}" old)
        endif()
        if(NOT old STREQUAL text)
            file(WRITE "${out}" "${text}")
        endif()
        list(APPEND outputs "${out}")
    endforeach()

    # A header dropped from the set must not linger where in-tree users look.
    file(GLOB present "${dir}/kvedge/*.h")
    foreach(f IN LISTS present)
        if(NOT f IN_LIST outputs)
            file(REMOVE "${f}")
        endif()
    endforeach()
    set(${out_var} "${outputs}" PARENT_SCOPE)
endfunction()

# kvedge_check_header_version(HEADER): fails unless HEADER's KVEDGE_VERSION_MAJOR/MINOR/PATCH
# are the project's version (project(... VERSION) in the top CMakeLists.txt), which names the
# shared library (VERSION) and kvedge.pc and gives kvedge_version() / kvedge_version_number();
# MINOR and PATCH stay below 100 so that KVEDGE_VERSION_NUMBER orders versions.
function(kvedge_check_header_version header)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${header}")
    file(READ "${header}" text)
    foreach(part MINOR PATCH)
        if(PROJECT_VERSION_${part} GREATER 99)
            message(FATAL_ERROR "project version ${PROJECT_VERSION}: ${part} must stay below "
                                "100 (KVEDGE_VERSION_NUMBER is MAJOR*10000 + MINOR*100 + PATCH)")
        endif()
    endforeach()
    foreach(part MAJOR MINOR PATCH)
        if(NOT text MATCHES "#define[ \t]+KVEDGE_VERSION_${part}[ \t]+([0-9]+)")
            message(FATAL_ERROR "${header}: no #define KVEDGE_VERSION_${part}")
        endif()
        if(NOT CMAKE_MATCH_1 EQUAL PROJECT_VERSION_${part})
            message(FATAL_ERROR
                "${header} says KVEDGE_VERSION_${part} ${CMAKE_MATCH_1}, the project version is "
                "${PROJECT_VERSION}: change both together")
        endif()
    endforeach()
    if(NOT text MATCHES "#define[ \t]+KVEDGE_VERSION_NUMBER")
        message(FATAL_ERROR "${header}: no #define KVEDGE_VERSION_NUMBER")
    endif()
endfunction()
