package protocol

import (
	"context"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Authorization wraps the handlers: before one runs, requests are checked
// against Config.Authorizer for the connection's principal and client
// address. A resource the principal may not use gets the error code Kafka
// clients expect in its place in the response (TOPIC_AUTHORIZATION_FAILED,
// GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED) and the rest
// of the request is served. The operations checked are Kafka's:
//
//	Produce                 Write on each topic (transactional: and Write on the
//	                        TransactionalId)
//	Fetch, OffsetCommit     Read on each topic (OffsetCommit: and Read on the group)
//	ListOffsets, Metadata   Describe on each topic (Metadata lists only those)
//	auto-creating Metadata  Create on the topic
//	CreateTopics            Create on each topic
//	CreatePartitions        Alter on each topic
//	DeleteTopics            Delete on each topic
//	DeleteRecords           Delete on each topic
//	DeleteGroups            Delete on each group
//	OffsetDelete            Delete on the group and Read on each topic
//	DescribeLogDirs         Describe on the cluster
//	DescribeCluster         nothing, as in Kafka; the cluster's authorized
//	                        operations, when asked for, need Describe on it
//	OffsetFetch             Describe on the group and on each topic
//	FindCoordinator         Describe on the group
//	JoinGroup, SyncGroup,   Read on the group
//	Heartbeat, LeaveGroup
//	DescribeGroups          Describe on each group (ListGroups lists only those)
//	ConsumerGroupHeartbeat  Read on the group, Describe on each subscribed topic
//	ConsumerGroupDescribe   Describe on each group
//	Describe/Create/DeleteAcls  Describe/Alter on the cluster
//	DescribeConfigs         DescribeConfigs on each topic (the cluster for the broker)
//	(Incremental)AlterConfigs  AlterConfigs on each topic (the cluster for the broker)
//	InitProducerId with a   Write on the TransactionalId
//	transactional id
//	FindCoordinator (txn)   Describe on the TransactionalId
//	AddPartitionsToTxn      Write on the TransactionalId and on each topic
//	AddOffsetsToTxn         Write on the TransactionalId, Read on the group
//	TxnOffsetCommit         Write on the TransactionalId, Read on the group and
//	                        on each topic
//	EndTxn                  Write on the TransactionalId
//	DescribeTransactions    Describe on each TransactionalId (ListTransactions
//	                        lists only those)
//
// ApiVersions, the SASL requests and InitProducerId without a
// transactional id (an id for an idempotent producer, which then still
// needs Write on each topic) are not checked. Any other request type fails
// closed: authorizeSync refuses it and the connection is closed, so an API
// added to the server without a check here is never served unchecked.

// can reports whether c may do op on the resource; everything is allowed
// without an Authorizer.
func (s *Server) can(c *conn, op kmsg.ACLOperation, rt kmsg.ACLResourceType, name string) bool {
	return s.authz == nil || s.authz.Allowed(c.principal, c.host, op, rt, name)
}

func (s *Server) canTopic(c *conn, op kmsg.ACLOperation, topic string) bool {
	return s.can(c, op, kmsg.ACLResourceTypeTopic, topic)
}

func (s *Server) canGroup(c *conn, op kmsg.ACLOperation, group string) bool {
	return s.can(c, op, kmsg.ACLResourceTypeGroup, group)
}

func (s *Server) canTxn(c *conn, op kmsg.ACLOperation, txnID string) bool {
	return s.can(c, op, kmsg.ACLResourceTypeTransactionalId, txnID)
}

// canConfigs reports whether c may do op (DescribeConfigs or
// AlterConfigs) on a config resource: a topic, or the broker (the
// cluster resource, as Kafka checks it).
func (s *Server) canConfigs(c *conn, op kmsg.ACLOperation, rt kmsg.ConfigResourceType, name string) bool {
	if rt == kmsg.ConfigResourceTypeTopic {
		return s.canTopic(c, op, name)
	}
	return s.can(c, op, kmsg.ACLResourceTypeCluster, clusterName)
}

// split splits the entries of a request into those allowed and the rest,
// into new slices (the request's own is left as it was).
func split[T any](entries []T, allowed func(T) bool) (kept, denied []T) {
	kept = entries[:0:0]
	for _, e := range entries {
		if allowed(e) {
			kept = append(kept, e)
		} else {
			denied = append(denied, e)
		}
	}
	return kept, denied
}

// refuse takes the entries allowed refuses out of *entries (a request's
// topics, groups or resources) and returns the fix that answers each of
// them in the response (of type R) with answer; with nothing refused it
// leaves *entries as it was and returns nil.
func refuse[E any, R kmsg.Response](entries *[]E, allowed func(E) bool, answer func(resp R, refused E)) func(kmsg.Response) {
	kept, denied := split(*entries, allowed)
	if len(denied) == 0 {
		return nil
	}
	*entries = kept
	return func(r kmsg.Response) {
		resp := r.(R)
		for _, e := range denied {
			answer(resp, e)
		}
	}
}

// refusals is the response's partitions of a refused topic: refusal of
// each of the request's.
func refusals[RP, P any](parts []RP, refusal func(RP) P) []P {
	var out []P
	for _, rp := range parts {
		out = append(out, refusal(rp))
	}
	return out
}

// refuseCoordinators refuses, with code, each coordinator key of a
// FindCoordinator that allowed refuses (the one key of a request before
// v4).
func refuseCoordinators(req *kmsg.FindCoordinatorRequest, resp *kmsg.FindCoordinatorResponse, code int16, allowed func(key string) bool) {
	if req.Version < 4 {
		if !allowed(req.CoordinatorKey) {
			resp.ErrorCode, resp.NodeID, resp.Host, resp.Port = code, -1, "", -1
		}
		return
	}
	for i := range resp.Coordinators {
		co := &resp.Coordinators[i]
		if !allowed(co.Key) {
			co.ErrorCode, co.NodeID, co.Host, co.Port = code, -1, "", -1
		}
	}
}

// configsDenied is the error code of a config resource refused.
func configsDenied(rt kmsg.ConfigResourceType) int16 {
	if rt == kmsg.ConfigResourceTypeTopic {
		return topicDenied
	}
	return kerr.ClusterAuthorizationFailed.Code
}

var topicDenied = kerr.TopicAuthorizationFailed.Code
var groupDenied = kerr.GroupAuthorizationFailed.Code
var txnDenied = kerr.TransactionalIDAuthorizationFailed.Code

// authorizeProduce takes the topics c may not write out of req and
// returns a function that adds them to the response, refused.
func (s *Server) authorizeProduce(c *conn, req *kmsg.ProduceRequest) func(kmsg.Response) {
	if s.authz == nil {
		return nil
	}
	code := topicDenied
	txnOK := req.TransactionID == nil || s.canTxn(c, kmsg.ACLOperationWrite, *req.TransactionID)
	if !txnOK {
		code = txnDenied
	}
	return refuse(&req.Topics, func(t kmsg.ProduceRequestTopic) bool { return txnOK && s.canTopic(c, kmsg.ACLOperationWrite, t.Topic) },
		func(resp *kmsg.ProduceResponse, rt kmsg.ProduceRequestTopic) {
			t := kmsg.NewProduceResponseTopic()
			t.Topic = rt.Topic
			t.Partitions = refusals(rt.Partitions, func(rp kmsg.ProduceRequestTopicPartition) kmsg.ProduceResponseTopicPartition {
				p := kmsg.NewProduceResponseTopicPartition()
				p.Partition, p.ErrorCode = rp.Partition, code
				p.BaseOffset, p.LogAppendTime, p.LogStartOffset = -1, -1, -1
				return p
			})
			resp.Topics = append(resp.Topics, t)
		})
}

// authorizeFetch does the same for Fetch; a refused topic answers at once.
func (s *Server) authorizeFetch(c *conn, req *kmsg.FetchRequest) func(kmsg.Response) {
	if s.authz == nil {
		return nil
	}
	fix := refuse(&req.Topics, func(t kmsg.FetchRequestTopic) bool { return s.canTopic(c, kmsg.ACLOperationRead, t.Topic) },
		func(resp *kmsg.FetchResponse, rt kmsg.FetchRequestTopic) {
			t := kmsg.NewFetchResponseTopic()
			t.Topic, t.TopicID = rt.Topic, rt.TopicID
			t.Partitions = refusals(rt.Partitions, func(rp kmsg.FetchRequestTopicPartition) kmsg.FetchResponseTopicPartition {
				p := kmsg.NewFetchResponseTopicPartition()
				p.Partition, p.ErrorCode = rp.Partition, topicDenied
				p.HighWatermark, p.LastStableOffset, p.LogStartOffset, p.PreferredReadReplica = -1, -1, -1, -1
				p.RecordBatches = []byte{}
				return p
			})
			resp.Topics = append(resp.Topics, t)
		})
	if fix != nil {
		req.MaxWaitMillis = 0
	}
	return fix
}

// errUnauthorizedAPI refuses a request type authorizeSync has no check
// for.
var errUnauthorizedAPI = fmt.Errorf("%w: no authorization check for this API", errBadRequest)

// authorizeSync checks the requests answered by handleSync: it returns a
// complete refusal, or a function that fixes the response up, or neither;
// or, for a request type it has no rule for, errUnauthorizedAPI, which
// closes the connection (fail closed).
func (s *Server) authorizeSync(ctx context.Context, c *conn, r request) (kmsg.Response, func(kmsg.Response), error) {
	if s.authz == nil {
		return nil, nil, nil
	}
	refused, fix, known := s.authorizeRequest(c, r.req)
	if !known {
		return nil, nil, fmt.Errorf("%w: %s", errUnauthorizedAPI, kmsg.NameForKey(r.key))
	}
	return refused, fix, nil
}

// authorizeRequest is authorizeSync's table; known is false for a request
// type without a rule.
func (s *Server) authorizeRequest(c *conn, r kmsg.Request) (refused kmsg.Response, fix func(kmsg.Response), known bool) {
	refused, fix, known = s.authorizeTxn(c, r)
	if known {
		return refused, fix, true
	}
	switch r.(type) {
	case *kmsg.ApiVersionsRequest, *kmsg.SASLHandshakeRequest, *kmsg.SASLAuthenticateRequest,
		*kmsg.MetadataRequest, *kmsg.DescribeACLsRequest, *kmsg.CreateACLsRequest, *kmsg.DeleteACLsRequest:
		// ApiVersions and SASL are open to all; Metadata filters by
		// topic in its handler, and the ACL APIs check the cluster
		// resource in theirs (acl.go).
		return nil, nil, true
	case *kmsg.JoinGroupRequest, *kmsg.SyncGroupRequest, *kmsg.HeartbeatRequest, *kmsg.LeaveGroupRequest,
		*kmsg.FindCoordinatorRequest, *kmsg.OffsetCommitRequest, *kmsg.OffsetFetchRequest,
		*kmsg.DescribeGroupsRequest, *kmsg.ListGroupsRequest, *kmsg.ListOffsetsRequest,
		*kmsg.DescribeConfigsRequest, *kmsg.AlterConfigsRequest, *kmsg.IncrementalAlterConfigsRequest,
		*kmsg.CreateTopicsRequest, *kmsg.CreatePartitionsRequest, *kmsg.DeleteTopicsRequest, *kmsg.DeleteRecordsRequest,
		*kmsg.DeleteGroupsRequest, *kmsg.OffsetDeleteRequest, *kmsg.DescribeLogDirsRequest, *kmsg.DescribeClusterRequest,
		*kmsg.ConsumerGroupHeartbeatRequest, *kmsg.ConsumerGroupDescribeRequest:
		refused, fix = s.authorizeClassic(c, r)
		return refused, fix, true
	case *kmsg.ShareGroupHeartbeatRequest, *kmsg.ShareGroupDescribeRequest, *kmsg.ShareFetchRequest, *kmsg.ShareAcknowledgeRequest,
		*kmsg.DescribeShareGroupOffsetsRequest, *kmsg.AlterShareGroupOffsetsRequest, *kmsg.DeleteShareGroupOffsetsRequest:
		return s.authorizeShare(c, r), nil, true
	}
	return nil, nil, false
}

// authorizeClassic checks the group, topic and config requests.
func (s *Server) authorizeClassic(c *conn, r kmsg.Request) (kmsg.Response, func(kmsg.Response)) {
	switch req := r.(type) {
	case *kmsg.JoinGroupRequest:
		if !s.canGroup(c, kmsg.ACLOperationRead, req.Group) {
			resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
			resp.ErrorCode, resp.Generation = groupDenied, -1
			return resp, nil
		}
	case *kmsg.SyncGroupRequest:
		if !s.canGroup(c, kmsg.ACLOperationRead, req.Group) {
			resp := req.ResponseKind().(*kmsg.SyncGroupResponse)
			resp.ErrorCode = groupDenied
			return resp, nil
		}
	case *kmsg.HeartbeatRequest:
		if !s.canGroup(c, kmsg.ACLOperationRead, req.Group) {
			resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
			resp.ErrorCode = groupDenied
			return resp, nil
		}
	case *kmsg.LeaveGroupRequest:
		if !s.canGroup(c, kmsg.ACLOperationRead, req.Group) {
			resp := req.ResponseKind().(*kmsg.LeaveGroupResponse)
			resp.ErrorCode = groupDenied
			return resp, nil
		}
	case *kmsg.ConsumerGroupHeartbeatRequest:
		resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		if !s.canGroup(c, kmsg.ACLOperationRead, req.Group) {
			resp.ErrorCode = groupDenied
			return resp, nil
		}
		for _, t := range req.SubscribedTopicNames {
			if !s.canTopic(c, kmsg.ACLOperationDescribe, t) {
				resp.ErrorCode = topicDenied
				msg := "not authorized to describe subscribed topic " + t
				resp.ErrorMessage = &msg
				return resp, nil
			}
		}
	case *kmsg.ConsumerGroupDescribeRequest:
		return nil, func(r kmsg.Response) {
			resp := r.(*kmsg.ConsumerGroupDescribeResponse)
			for i := range resp.Groups {
				g := &resp.Groups[i]
				if !s.canGroup(c, kmsg.ACLOperationDescribe, g.Group) {
					id := g.Group
					*g = kmsg.NewConsumerGroupDescribeResponseGroup()
					g.Group, g.ErrorCode = id, groupDenied
				}
			}
		}
	case *kmsg.FindCoordinatorRequest:
		return nil, func(r kmsg.Response) {
			if req.CoordinatorType != coordinatorGroup {
				return
			}
			refuseCoordinators(req, r.(*kmsg.FindCoordinatorResponse), groupDenied, func(key string) bool {
				return s.canGroup(c, kmsg.ACLOperationDescribe, key)
			})
		}
	case *kmsg.OffsetCommitRequest:
		groupOK := s.canGroup(c, kmsg.ACLOperationRead, req.Group)
		code := topicDenied
		if !groupOK {
			code = groupDenied
		}
		return nil, refuse(&req.Topics, func(t kmsg.OffsetCommitRequestTopic) bool {
			return groupOK && s.canTopic(c, kmsg.ACLOperationRead, t.Topic)
		}, func(resp *kmsg.OffsetCommitResponse, rt kmsg.OffsetCommitRequestTopic) {
			t := kmsg.NewOffsetCommitResponseTopic()
			t.Topic = rt.Topic
			t.Partitions = refusals(rt.Partitions, func(rp kmsg.OffsetCommitRequestTopicPartition) kmsg.OffsetCommitResponseTopicPartition {
				p := kmsg.NewOffsetCommitResponseTopicPartition()
				p.Partition, p.ErrorCode = rp.Partition, code
				return p
			})
			resp.Topics = append(resp.Topics, t)
		})
	case *kmsg.OffsetFetchRequest:
		return nil, func(r kmsg.Response) {
			resp := r.(*kmsg.OffsetFetchResponse)
			if req.Version >= 8 {
				for i := range resp.Groups {
					g := &resp.Groups[i]
					if !s.canGroup(c, kmsg.ACLOperationDescribe, g.Group) {
						g.ErrorCode, g.Topics = groupDenied, nil
						continue
					}
					for j := range g.Topics {
						if !s.canTopic(c, kmsg.ACLOperationDescribe, g.Topics[j].Topic) {
							for k := range g.Topics[j].Partitions {
								g.Topics[j].Partitions[k].ErrorCode, g.Topics[j].Partitions[k].Offset = topicDenied, -1
							}
						}
					}
				}
				return
			}
			if !s.canGroup(c, kmsg.ACLOperationDescribe, req.Group) {
				resp.ErrorCode, resp.Topics = groupDenied, nil
				return
			}
			for j := range resp.Topics {
				if !s.canTopic(c, kmsg.ACLOperationDescribe, resp.Topics[j].Topic) {
					for k := range resp.Topics[j].Partitions {
						resp.Topics[j].Partitions[k].ErrorCode, resp.Topics[j].Partitions[k].Offset = topicDenied, -1
					}
				}
			}
		}
	case *kmsg.DescribeGroupsRequest:
		return nil, func(r kmsg.Response) {
			resp := r.(*kmsg.DescribeGroupsResponse)
			for i := range resp.Groups {
				g := &resp.Groups[i]
				if !s.canGroup(c, kmsg.ACLOperationDescribe, g.Group) {
					id := g.Group
					*g = kmsg.NewDescribeGroupsResponseGroup()
					g.Group, g.ErrorCode = id, groupDenied
				}
			}
		}
	case *kmsg.ListGroupsRequest:
		return nil, func(r kmsg.Response) {
			resp := r.(*kmsg.ListGroupsResponse)
			resp.Groups = slices.DeleteFunc(resp.Groups, func(g kmsg.ListGroupsResponseGroup) bool {
				return !s.canGroup(c, kmsg.ACLOperationDescribe, g.Group)
			})
		}
	case *kmsg.ListOffsetsRequest:
		return nil, refuse(&req.Topics, func(t kmsg.ListOffsetsRequestTopic) bool { return s.canTopic(c, kmsg.ACLOperationDescribe, t.Topic) },
			func(resp *kmsg.ListOffsetsResponse, rt kmsg.ListOffsetsRequestTopic) {
				t := kmsg.NewListOffsetsResponseTopic()
				t.Topic = rt.Topic
				t.Partitions = refusals(rt.Partitions, func(rp kmsg.ListOffsetsRequestTopicPartition) kmsg.ListOffsetsResponseTopicPartition {
					p := kmsg.NewListOffsetsResponseTopicPartition()
					p.Partition, p.ErrorCode, p.Offset, p.Timestamp, p.LeaderEpoch = rp.Partition, topicDenied, -1, -1, -1
					return p
				})
				resp.Topics = append(resp.Topics, t)
			})
	case *kmsg.DescribeConfigsRequest:
		return nil, refuse(&req.Resources, func(r kmsg.DescribeConfigsRequestResource) bool {
			return s.canConfigs(c, kmsg.ACLOperationDescribeConfigs, r.ResourceType, r.ResourceName)
		}, func(resp *kmsg.DescribeConfigsResponse, d kmsg.DescribeConfigsRequestResource) {
			rr := kmsg.NewDescribeConfigsResponseResource()
			rr.ResourceType, rr.ResourceName, rr.ErrorCode = d.ResourceType, d.ResourceName, configsDenied(d.ResourceType)
			resp.Resources = append(resp.Resources, rr)
		})
	case *kmsg.AlterConfigsRequest:
		return nil, refuse(&req.Resources, func(r kmsg.AlterConfigsRequestResource) bool {
			return s.canConfigs(c, kmsg.ACLOperationAlterConfigs, r.ResourceType, r.ResourceName)
		}, func(resp *kmsg.AlterConfigsResponse, d kmsg.AlterConfigsRequestResource) {
			rr := kmsg.NewAlterConfigsResponseResource()
			rr.ResourceType, rr.ResourceName, rr.ErrorCode = d.ResourceType, d.ResourceName, configsDenied(d.ResourceType)
			resp.Resources = append(resp.Resources, rr)
		})
	case *kmsg.IncrementalAlterConfigsRequest:
		return nil, refuse(&req.Resources, func(r kmsg.IncrementalAlterConfigsRequestResource) bool {
			return s.canConfigs(c, kmsg.ACLOperationAlterConfigs, r.ResourceType, r.ResourceName)
		}, func(resp *kmsg.IncrementalAlterConfigsResponse, d kmsg.IncrementalAlterConfigsRequestResource) {
			rr := kmsg.NewIncrementalAlterConfigsResponseResource()
			rr.ResourceType, rr.ResourceName, rr.ErrorCode = d.ResourceType, d.ResourceName, configsDenied(d.ResourceType)
			resp.Resources = append(resp.Resources, rr)
		})
	case *kmsg.CreatePartitionsRequest:
		return nil, refuse(&req.Topics, func(t kmsg.CreatePartitionsRequestTopic) bool { return s.canTopic(c, kmsg.ACLOperationAlter, t.Topic) },
			func(resp *kmsg.CreatePartitionsResponse, d kmsg.CreatePartitionsRequestTopic) {
				t := kmsg.NewCreatePartitionsResponseTopic()
				t.Topic, t.ErrorCode = d.Topic, topicDenied
				resp.Topics = append(resp.Topics, t)
			})
	case *kmsg.DeleteTopicsRequest:
		// Topics named by id are resolved first, so the check is by name.
		kept, denied := split(s.deleteTopicNames(req), func(t kmsg.DeleteTopicsRequestTopic) bool {
			return t.Topic == nil || s.canTopic(c, kmsg.ACLOperationDelete, *t.Topic)
		})
		if req.Version < 6 {
			req.TopicNames = req.TopicNames[:0:0]
			for _, t := range kept {
				req.TopicNames = append(req.TopicNames, *t.Topic)
			}
		} else {
			req.Topics = kept
		}
		return nil, func(r kmsg.Response) {
			resp := r.(*kmsg.DeleteTopicsResponse)
			for _, d := range denied {
				t := kmsg.NewDeleteTopicsResponseTopic()
				t.Topic, t.TopicID, t.ErrorCode = d.Topic, topicID(*d.Topic), topicDenied
				resp.Topics = append(resp.Topics, t)
			}
		}
	case *kmsg.DeleteRecordsRequest:
		return nil, refuse(&req.Topics, func(t kmsg.DeleteRecordsRequestTopic) bool { return s.canTopic(c, kmsg.ACLOperationDelete, t.Topic) },
			func(resp *kmsg.DeleteRecordsResponse, d kmsg.DeleteRecordsRequestTopic) {
				t := kmsg.NewDeleteRecordsResponseTopic()
				t.Topic = d.Topic
				t.Partitions = refusals(d.Partitions, func(dp kmsg.DeleteRecordsRequestTopicPartition) kmsg.DeleteRecordsResponseTopicPartition {
					p := kmsg.NewDeleteRecordsResponseTopicPartition()
					p.Partition, p.LowWatermark, p.ErrorCode = dp.Partition, -1, topicDenied
					return p
				})
				resp.Topics = append(resp.Topics, t)
			})
	case *kmsg.DeleteGroupsRequest:
		return nil, refuse(&req.Groups, func(g string) bool { return s.canGroup(c, kmsg.ACLOperationDelete, g) },
			func(resp *kmsg.DeleteGroupsResponse, g string) {
				rg := kmsg.NewDeleteGroupsResponseGroup()
				rg.Group, rg.ErrorCode = g, groupDenied
				resp.Groups = append(resp.Groups, rg)
			})
	case *kmsg.OffsetDeleteRequest:
		if !s.canGroup(c, kmsg.ACLOperationDelete, req.Group) {
			resp := req.ResponseKind().(*kmsg.OffsetDeleteResponse)
			resp.ErrorCode = groupDenied
			return resp, nil
		}
		return nil, refuse(&req.Topics, func(t kmsg.OffsetDeleteRequestTopic) bool { return s.canTopic(c, kmsg.ACLOperationRead, t.Topic) },
			func(resp *kmsg.OffsetDeleteResponse, d kmsg.OffsetDeleteRequestTopic) {
				t := kmsg.NewOffsetDeleteResponseTopic()
				t.Topic = d.Topic
				t.Partitions = refusals(d.Partitions, func(dp kmsg.OffsetDeleteRequestTopicPartition) kmsg.OffsetDeleteResponseTopicPartition {
					p := kmsg.NewOffsetDeleteResponseTopicPartition()
					p.Partition, p.ErrorCode = dp.Partition, topicDenied
					return p
				})
				resp.Topics = append(resp.Topics, t)
			})
	case *kmsg.DescribeLogDirsRequest:
		if !s.can(c, kmsg.ACLOperationDescribe, kmsg.ACLResourceTypeCluster, clusterName) {
			resp := req.ResponseKind().(*kmsg.DescribeLogDirsResponse)
			resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
			return resp, nil
		}
	case *kmsg.DescribeClusterRequest:
		// Answered to everyone, as Kafka does; the handler asks
		// clusterOperations for the authorized operations.
		return nil, nil
	case *kmsg.CreateTopicsRequest:
		return nil, refuse(&req.Topics, func(t kmsg.CreateTopicsRequestTopic) bool {
			return s.canTopic(c, kmsg.ACLOperationCreate, t.Topic) || s.can(c, kmsg.ACLOperationCreate, kmsg.ACLResourceTypeCluster, clusterName)
		}, func(resp *kmsg.CreateTopicsResponse, d kmsg.CreateTopicsRequestTopic) {
			t := kmsg.NewCreateTopicsResponseTopic()
			t.Topic, t.ErrorCode, t.NumPartitions, t.ReplicationFactor = d.Topic, topicDenied, -1, -1
			resp.Topics = append(resp.Topics, t)
		})
	}
	return nil, nil
}

// clusterOperations is the bit set of operations c may do on the cluster
// (Kafka's authorized operations: bit n for operation n), 0 without
// Describe on it.
func (s *Server) clusterOperations(c *conn) int32 {
	if !s.can(c, kmsg.ACLOperationDescribe, kmsg.ACLResourceTypeCluster, clusterName) {
		return 0
	}
	var ops int32
	for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationCreate, kmsg.ACLOperationAlter, kmsg.ACLOperationDescribe,
		kmsg.ACLOperationClusterAction, kmsg.ACLOperationDescribeConfigs, kmsg.ACLOperationAlterConfigs, kmsg.ACLOperationIdempotentWrite} {
		if s.can(c, op, kmsg.ACLResourceTypeCluster, clusterName) {
			ops |= 1 << int(op)
		}
	}
	return ops
}
