# The committed default model (models/, issue 15): each file has exactly the sha256 that the issue
# and models/README.md give, and the README states it.   -DMODELS=<source>/models
set(_expected
  "stories260K.bin|b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696"
  "tok512.bin|037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312")
file(READ ${MODELS}/README.md _readme)
foreach(_entry IN LISTS _expected)
  string(REPLACE "|" ";" _entry "${_entry}")
  list(GET _entry 0 _name)
  list(GET _entry 1 _want)
  if(NOT EXISTS ${MODELS}/${_name})
    message(FATAL_ERROR "${MODELS}/${_name} is missing")
  endif()
  file(SHA256 ${MODELS}/${_name} _got)
  if(NOT _got STREQUAL _want)
    message(FATAL_ERROR "${MODELS}/${_name}: sha256 ${_got}, expected ${_want}")
  endif()
  string(FIND "${_readme}" "${_want}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${MODELS}/README.md does not give the sha256 of ${_name} (${_want})")
  endif()
  message(STATUS "${_name}: sha256 ${_got}")
endforeach()
