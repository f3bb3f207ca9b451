"""Each op's argument rules, once for both layers: spec/<op>.py per op family, made of the
primitive rules of spec/_rules.py. No framework is imported here.

A spec function takes plain facts (an array as (shape, dtype name), options as given) and either
raises (TypeError for a wrong kind or dtype, ValueError for a wrong value or shape; the message
names the argument first, then what was expected) or returns the op's options as one frozen
object, whose op_args() are the raw op's scalar arguments. fuselet.torch and fuselet.jax call the
same function at each entry point, and the torch fake impls call the raw ops' own (the `*_op`
functions, the rules the core checks in C++ as well), so the layers refuse alike.

Each module keeps beside its rules EXAMPLES (a valid call of each public op) and REFUSALS (a bad
value for every rule, with its refusal; OP_REFUSALS for the raw ops' own rules), which
tests/test_spec.py gives to both layers and to the raw torch ops.
"""
