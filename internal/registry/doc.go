// Package registry owns the relay's schema contracts: an embedded schema
// registry stored in Postgres with the relay's other state (migration
// 010), served over the subset of the Confluent Schema Registry REST API
// that the common serializers use (http.go), the compatibility rules
// between versions of a subject (compat.go, per format in avro.go and
// jsonschema.go), and the validator the relay core calls to check each
// event on a topic with a contract before publishing it (validator.go).
//
// Formats: Avro through github.com/hamba/avro/v2 (parsing, canonical form,
// binary decoding), JSON Schema through
// github.com/santhosh-tekuri/jsonschema/v6 (drafts 4 to 2020-12, passes
// the JSON-Schema-Test-Suite; a fast path for common schemas, jsonfast.go)
// and Protobuf through github.com/bufbuild/protocompile (the compiler
// behind buf, producing protobuf-go descriptors; payloads decoded with
// dynamicpb). Compatibility is this package's own walk over the parsed
// schemas, so that it can name every violation in plain words; for Avro
// its verdicts are tested against hamba/avro's own schema-resolution
// check. Schema references (imports other than Protobuf's well-known
// types) are refused with a clear error.
//
// # Faults
//
// Writes (register, delete, configure) each run in one transaction that
// first bumps registry_state.generation: concurrent writers, in one relay
// or several sharing the database, are serialized by that row, so two
// registrations cannot both pass a compatibility check against the same
// history. A crash before the commit leaves nothing; ids come from an
// identity column and a schema keeps its id forever (a hard delete
// removes versions, never schemas), so a record framed with an id stays
// readable.
//
// The validator reads the registry's live versions in one repeatable-read
// snapshot and keeps them in memory; before each batch the core asks it
// to refresh, which costs one single-row read of the generation and a
// reload only when it changed. A batch is therefore judged by the
// contracts committed before its publication began. When the registry
// cannot be read the refresh fails and so does the pipeline, which
// restarts: no event is dead-lettered, or published unchecked, because
// Postgres was unreachable. Validation is a pure function of the payload
// and the snapshot, so an event read again after a crash is judged the
// same way unless a version was registered or deleted in between; its
// dead letter and its deletion from the outbox commit together in the
// core's acknowledgement.
package registry
