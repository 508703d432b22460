# ctest `cmake_package_consumer`: installs the build into a temporary prefix, configures and builds
# this folder against it (find_package(moekit)), runs both programs, and imports the installed
# Python package (which must find libmoekit_c.so next to itself).
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DPYTHON=... -DPYTHON_DIR=... -P run.cmake
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT COMMAND_ERROR_IS_FATAL ANY)
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
run(${WORK_DIR}/build/consumer)
run(${WORK_DIR}/build/consumer_c)
if(PYTHON)
  run(${CMAKE_COMMAND} -E env --unset=MOEKIT_LIBRARY PYTHONDONTWRITEBYTECODE=1
      PYTHONPATH=${prefix}/${PYTHON_DIR} ${PYTHON} ${SOURCE_DIR}/tests/consumer/import_installed.py)
endif()
