# The project's layers and the include edges allowed between them, checked at configure time.
#
# Each layer owns folders (its sources and its public headers under include/tspemu/). A file
# belongs to the layer owning the longest folder prefix of its path. For every `#include "..."`
# of every C++ file of every layer, the included file is resolved (tspemu/... under include/,
# else relative to the including file, else under the folders of TSPEMU_LAYER_SEARCH_DIRS) and
# the edge from the file's layer to the included file's layer must be allowed:
#   TSPEMU_LAYER_<name>_MAY      layers whose every header the layer may include;
#   TSPEMU_LAYER_<name>_HEADERS  single headers (paths from the project root) of other layers it
#                                may include, where a whole layer would be too coarse.
# The allowed edges (both kinds, a header's edge counted as one to its layer) must form an acyclic
# graph, except the edges listed in TSPEMU_LAYER_KNOWN_BACK_EDGES: debt to pay off, never to add to.
# A violation fails the configure, naming the file, the include and the edge.
#
# Rules kept here: the runtime knows nothing of transformers (no reference, tsp, check, plan);
# the reference knows nothing of ranks (no runtime); the collective algorithms reach other ranks
# only through the transport (not the world's state); the planner is a leaf (core, the model
# config, the traffic counters and the simulated clock's model only).

# The layers, from the bottom up: tspemu_layer(NAME DIRS folders... [MAY layers...]
# [HEADERS files...]) appends NAME to TSPEMU_LAYERS and sets TSPEMU_LAYER_<NAME>_DIRS, _MAY and
# _HEADERS.
set(TSPEMU_LAYERS)
function(tspemu_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "DIRS;MAY;HEADERS")
  set(TSPEMU_LAYERS ${TSPEMU_LAYERS} ${name} PARENT_SCOPE)
  foreach(kind DIRS MAY HEADERS)
    set(TSPEMU_LAYER_${name}_${kind} ${arg_${kind}} PARENT_SCOPE)
  endforeach()
endfunction()

tspemu_layer(core DIRS core include/tspemu/core)

# The runtime's public headers (include/tspemu/runtime: the API installed for users).
tspemu_layer(runtime/api DIRS include/tspemu/runtime MAY core)

# The transports: how bytes move between ranks (transport.hpp's verbs), shared memory and MPI.
tspemu_layer(runtime/transport DIRS runtime/transport MAY core runtime/api
             HEADERS runtime/world/world_state.hpp runtime/world/wait.hpp
                     runtime/world/op_hooks.hpp runtime/world/observer.hpp
                     runtime/world/dry_reservation.hpp)

# The collective algorithms, written against the transport's verbs (transport/call.hpp): not the
# shared-memory or MPI transport, nor the world's state.
set(TSPEMU_TRANSPORT_VERBS
    runtime/transport/call.hpp runtime/transport/transport.hpp runtime/transport/op_ref.hpp
    runtime/transport/deferred_calls.hpp runtime/transport/early_exposure.hpp)
tspemu_layer(runtime/collectives DIRS runtime/collectives MAY core runtime/api
             HEADERS ${TSPEMU_TRANSPORT_VERBS})

# The world: ranks as threads, their state, the wait loop, the observer interface, World and Comm.
tspemu_layer(runtime/world DIRS runtime/world MAY core runtime/api runtime/transport)

# The non-blocking collectives' handles (nonblocking.hpp), on the collectives and the transport's
# deferred calls and exposures.
tspemu_layer(runtime/nonblocking DIRS runtime/nonblocking MAY core runtime/api runtime/collectives
             HEADERS ${TSPEMU_TRANSPORT_VERBS})

# What runs beside the operations: trace, flight recorder, simulated clock and streams, traffic
# counters, fault injection (observer.hpp's hooks over the world's rank state).
tspemu_layer(runtime/observers DIRS runtime/observers MAY core runtime/api runtime/world)

tspemu_layer(reference DIRS reference include/tspemu/reference MAY core)

tspemu_layer(plan DIRS plan include/tspemu/plan MAY core
             HEADERS include/tspemu/reference/model_config.hpp include/tspemu/runtime/counters.hpp
                     include/tspemu/runtime/sim_clock.hpp)

tspemu_layer(tsp DIRS tsp include/tspemu/tsp MAY core runtime/api reference plan)
# Pipeline parallelism on ranks: runs the planner's schedules; a stage may later run a tsp strategy.
tspemu_layer(pipeline DIRS pipeline include/tspemu/pipeline MAY core runtime/api reference plan tsp)
tspemu_layer(check DIRS check include/tspemu/check MAY core runtime/api reference tsp)
tspemu_layer(apps DIRS apps MAY core runtime/api reference plan tsp pipeline check)
tspemu_layer(examples DIRS examples MAY core runtime/api reference plan tsp pipeline check)
tspemu_layer(bench DIRS bench MAY core runtime/api reference plan tsp pipeline check)
tspemu_layer(fuzz DIRS fuzz MAY core runtime/api reference plan tsp pipeline check apps)
tspemu_layer(tests DIRS tests MAY core runtime/api reference plan tsp pipeline check apps)

# Where an include not found beside its file is looked for (the targets' include directories).
set(TSPEMU_LAYER_SEARCH_DIRS include apps)

# "from -> to" edges allowed but left out of the acyclicity check. The transports still run on
# the world's rank state and wait loop (TSPEMU_LAYER_runtime/transport_HEADERS); a narrow rank
# context in runtime/transport removes this edge.
set(TSPEMU_LAYER_KNOWN_BACK_EDGES "runtime/transport -> runtime/world")

# The layer owning project-relative path `rel` (longest folder prefix), or "" when none does.
function(_tspemu_layer_of rel out)
  set(best "")
  set(best_len 0)
  foreach(layer ${TSPEMU_LAYERS})
    foreach(dir ${TSPEMU_LAYER_${layer}_DIRS})
      string(LENGTH "${dir}/" len)
      string(SUBSTRING "${rel}" 0 ${len} head)
      if(head STREQUAL "${dir}/" AND len GREATER best_len)
        set(best ${layer})
        set(best_len ${len})
      endif()
    endforeach()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

# Fails when the allowed edges (but the known back edges) contain a cycle (Kahn's algorithm).
function(_tspemu_check_layers_acyclic)
  set(remaining ${TSPEMU_LAYERS})
  foreach(layer ${TSPEMU_LAYERS})
    set(to_${layer} ${TSPEMU_LAYER_${layer}_MAY})
    foreach(h ${TSPEMU_LAYER_${layer}_HEADERS})
      _tspemu_layer_of("${h}" target)
      if(NOT "${layer} -> ${target}" IN_LIST TSPEMU_LAYER_KNOWN_BACK_EDGES)
        list(APPEND to_${layer} ${target})
      endif()
    endforeach()
    foreach(target ${to_${layer}})
      if(NOT target IN_LIST TSPEMU_LAYERS)
        message(FATAL_ERROR "tspemuLayers.cmake: layer ${layer} may include unknown layer ${target}")
      endif()
    endforeach()
  endforeach()
  while(remaining)
    set(progress FALSE)
    foreach(layer ${remaining})
      set(ready TRUE)
      foreach(target ${to_${layer}})
        if(target IN_LIST remaining)
          set(ready FALSE)
        endif()
      endforeach()
      if(ready)
        list(REMOVE_ITEM remaining ${layer})
        set(progress TRUE)
      endif()
    endforeach()
    if(NOT progress)
      # Keep only the layers on a cycle: drop, again and again, those no remaining layer includes.
      set(pruned TRUE)
      while(pruned)
        set(pruned FALSE)
        foreach(layer ${remaining})
          set(included FALSE)
          foreach(other ${remaining})
            if(layer IN_LIST to_${other})
              set(included TRUE)
            endif()
          endforeach()
          if(NOT included)
            list(REMOVE_ITEM remaining ${layer})
            set(pruned TRUE)
          endif()
        endforeach()
      endwhile()
      message(FATAL_ERROR "tspemuLayers.cmake: the allowed include edges between layers form a "
                          "cycle among: ${remaining}")
    endif()
  endwhile()
endfunction()

# Scans every C++ file of every layer and fails at the first include the table does not allow.
function(tspemu_check_layers)
  _tspemu_check_layers_acyclic()
  set(root ${PROJECT_SOURCE_DIR})
  set(violations "")
  foreach(layer ${TSPEMU_LAYERS})
    foreach(dir ${TSPEMU_LAYER_${layer}_DIRS})
      file(GLOB_RECURSE files ${root}/${dir}/*.hpp ${root}/${dir}/*.cpp ${root}/${dir}/*.h)
      foreach(file ${files})
        file(RELATIVE_PATH rel ${root} ${file})
        _tspemu_layer_of("${rel}" owner)
        if(NOT owner STREQUAL layer)
          continue()  # a file of a nested layer, checked with it
        endif()
        get_filename_component(here ${rel} DIRECTORY)
        file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
        foreach(line ${lines})
          string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
          set(target_rel "")
          foreach(base ${here} ${TSPEMU_LAYER_SEARCH_DIRS})
            if(EXISTS ${root}/${base}/${inc} AND target_rel STREQUAL "")
              file(REAL_PATH ${root}/${base}/${inc} abs)
              file(RELATIVE_PATH target_rel ${root} ${abs})
            endif()
          endforeach()
          if(target_rel STREQUAL "")
            continue()  # not a project file (generated or external)
          endif()
          _tspemu_layer_of("${target_rel}" target)
          if(target STREQUAL "" OR target STREQUAL layer OR target IN_LIST TSPEMU_LAYER_${layer}_MAY
             OR target_rel IN_LIST TSPEMU_LAYER_${layer}_HEADERS)
            continue()
          endif()
          set(may ${TSPEMU_LAYER_${layer}_MAY} ${TSPEMU_LAYER_${layer}_HEADERS})
          string(REPLACE ";" ", " may "${may}")
          string(APPEND violations "\n  ${rel}: #include \"${inc}\" (${target_rel}): "
                                   "layer ${layer} may not include layer ${target} (it may include: ${may})")
        endforeach()
      endforeach()
    endforeach()
  endforeach()
  if(violations)
    message(FATAL_ERROR "Include edges the layer table (cmake/tspemuLayers.cmake) does not allow:"
                        "${violations}")
  endif()
endfunction()
