"""The policy front end: ``extends:`` chains resolved into one policy, routes, the
expression language (:mod:`.expr`), and the semantic checks a schema cannot express."""
