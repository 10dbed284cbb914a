package protocol

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"
)

type versionRange struct{ min, max int16 }

// supportedVersions lists every API this server answers and the versions
// it handles. Nothing else is advertised: in particular not
// OffsetForLeaderEpoch, which clients would use to validate positions
// against leader epochs this single-node log does not track.
var supportedVersions = map[int16]versionRange{
	kmsg.Produce.Int16():                   {3, 9},
	kmsg.Fetch.Int16():                     {4, 13},
	kmsg.ListOffsets.Int16():               {0, 10},
	kmsg.Metadata.Int16():                  {0, 12},
	kmsg.OffsetCommit.Int16():              {0, 9},
	kmsg.OffsetFetch.Int16():               {0, 8},
	kmsg.FindCoordinator.Int16():           {0, 4},
	kmsg.JoinGroup.Int16():                 {0, 9},
	kmsg.Heartbeat.Int16():                 {0, 4},
	kmsg.LeaveGroup.Int16():                {0, 5},
	kmsg.SyncGroup.Int16():                 {0, 5},
	kmsg.DescribeGroups.Int16():            {0, 5},
	kmsg.ListGroups.Int16():                {0, 5},
	kmsg.ApiVersions.Int16():               {0, 3},
	kmsg.CreateTopics.Int16():              {0, 7},
	kmsg.DeleteTopics.Int16():              {0, 6},
	kmsg.CreatePartitions.Int16():          {0, 3},
	kmsg.DeleteRecords.Int16():             {0, 2},
	kmsg.DescribeLogDirs.Int16():           {0, 4},
	kmsg.DescribeCluster.Int16():           {0, 2},
	kmsg.DeleteGroups.Int16():              {0, 3},
	kmsg.OffsetDelete.Int16():              {0, 0},
	kmsg.InitProducerID.Int16():            {0, 4},
	kmsg.AddPartitionsToTxn.Int16():        {0, 3},
	kmsg.AddOffsetsToTxn.Int16():           {0, 3},
	kmsg.EndTxn.Int16():                    {0, 3},
	kmsg.TxnOffsetCommit.Int16():           {0, 3},
	kmsg.DescribeTransactions.Int16():      {0, 0},
	kmsg.ListTransactions.Int16():          {0, 1},
	kmsg.DescribeConfigs.Int16():           {0, 4},
	kmsg.AlterConfigs.Int16():              {0, 2},
	kmsg.IncrementalAlterConfigs.Int16():   {0, 1},
	kmsg.SASLHandshake.Int16():             {0, 1},
	kmsg.SASLAuthenticate.Int16():          {0, 2},
	kmsg.DescribeACLs.Int16():              {0, 3},
	kmsg.CreateACLs.Int16():                {0, 3},
	kmsg.DeleteACLs.Int16():                {0, 3},
	kmsg.ConsumerGroupHeartbeat.Int16():    {0, 1},
	kmsg.ConsumerGroupDescribe.Int16():     {0, 1},
	kmsg.ShareGroupHeartbeat.Int16():       {1, 1},
	kmsg.ShareGroupDescribe.Int16():        {1, 1},
	kmsg.ShareFetch.Int16():                {1, 2},
	kmsg.ShareAcknowledge.Int16():          {1, 2},
	kmsg.DescribeShareGroupOffsets.Int16(): {0, 1},
	kmsg.AlterShareGroupOffsets.Int16():    {0, 0},
	kmsg.DeleteShareGroupOffsets.Int16():   {0, 0},
}

func apiVersionKeys() []kmsg.ApiVersionsResponseApiKey {
	keys := make([]kmsg.ApiVersionsResponseApiKey, 0, len(supportedVersions))
	for k, v := range supportedVersions {
		key := kmsg.NewApiVersionsResponseApiKey()
		key.ApiKey, key.MinVersion, key.MaxVersion = k, v.min, v.max
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].ApiKey < keys[j].ApiKey })
	return keys
}

func (s *Server) handleApiVersions(req *kmsg.ApiVersionsRequest, resp *kmsg.ApiVersionsResponse) {
	resp.ApiKeys = apiVersionKeys()
}
