"""Stage 4, rewriting: passes that realise a plan on a copy of the captured program, each with a contract
(ir/passes.py), run in order by one pipeline that names a failing pass; the verifier.
"""
