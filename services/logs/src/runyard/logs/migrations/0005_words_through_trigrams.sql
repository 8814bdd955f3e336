-- Words are searched through the trigram index (`\mword\M`, case-insensitive:
-- runyard.logs.search): the text search index cost every ingested line about
-- a fifth of its insert, and its parser split words at `_`, which grep -w does not.
DROP INDEX IF EXISTS log_lines_words;
DROP FUNCTION IF EXISTS log_words_query(text);
DROP FUNCTION IF EXISTS log_words(text);
