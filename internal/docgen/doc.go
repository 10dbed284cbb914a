// Package docgen generates the parts of the documentation that the code
// already states: docs/reference.md (every command and flag of relay and
// relay-dev, every config-file key, every metric) and the table of Kafka
// APIs in docs/kafka-compatibility.md. `go run ./internal/devcli/docgen`
// rewrites them; TestGeneratedDocsUpToDate fails when they drift.
package docgen
