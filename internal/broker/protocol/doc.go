// Package protocol serves the Kafka wire protocol over the embedded broker
// (internal/broker), so that ordinary Kafka clients (franz-go, librdkafka
// and kcat, sarama, ...) produce to and consume from the relay's log.
package protocol
