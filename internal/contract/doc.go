// Package contract holds end-to-end tests of the write contract, run with
// both readers (poll and cdc) where both apply, against the real binary and a real
// PostgreSQL, with the log read back and checked for lost, duplicated and
// reordered events:
//
//   - outbox rows are immutable (migration 011): UPDATE, DELETE and
//     TRUNCATE by a service are refused with a clear error, in the
//     inserting transaction and after it, a savepoint rolled back
//     withdraws its events, and the relay's own acknowledgement still
//     deletes the published rows, through SIGKILLs;
//   - large payloads: incompressible payloads stored out of line
//     (TOASTed), and ones near --max-message-bytes, published byte for
//     byte;
//   - Debezium's outbox table (its documented DDL) attached with `relay
//     table attach` and written with plain INSERTs, through SIGKILLs;
//   - the tableless outbox (emit_message, WAL reader only): messages and
//     rows mixed in transactions, through SIGKILLs, and the refusals that
//     keep the poll reader from leaving messages behind.
//
// The package has no non-test code besides this comment; the helpers it
// uses are in internal/e2e.
package contract
