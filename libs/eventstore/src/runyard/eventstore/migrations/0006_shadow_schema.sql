-- Shadow tables of read models being rebuilt (`runyard rebuild`, libs/eventstore/shadow.py)
-- live in a schema of their own: the services create and drop them while they run, and
-- their roles may create tables there (runyard.stack.roles.apply_grants) but never in
-- `public`, where the live tables and the event log are.
CREATE SCHEMA IF NOT EXISTS runyard_shadow;
