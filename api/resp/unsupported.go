package resp

import "strings"

// notServed explains, after Redis's "unknown command" reply, why a Redis
// command of another data type is not served: every value here is an
// opaque string; of the read-modify-write commands only INCR, INCRBY,
// DECR, DECRBY, APPEND, GETSET and GETDEL are served (update.go). "" for other names.
func notServed(name []byte) string {
	kind, ok := otherTypes[strings.ToLower(string(name[:min(len(name), 32)]))]
	if !ok {
		return ""
	}
	return "(kvstrata serves string values with GET, SET, MGET, MSET, DEL, EXPIRE and SCAN; " + kind + " are not supported)"
}

// otherTypes names the Redis commands of the data types not served.
var otherTypes = func() map[string]string {
	m := map[string]string{}
	for kind, names := range map[string]string{
		"counters and in-place string updates": "incrbyfloat setrange getrange getex substr lcs",
		"lists":                                "lpush rpush lpushx rpushx lpop rpop lrange llen lindex lset lrem ltrim linsert lpos lmove blmove rpoplpush brpoplpush blpop brpop lmpop blmpop",
		"sets":                                 "sadd srem smembers sismember smismember scard spop srandmember sinter sintercard sinterstore sunion sunionstore sdiff sdiffstore smove sscan",
		"hashes":                               "hset hsetnx hget hmset hmget hgetall hdel hexists hincrby hincrbyfloat hkeys hvals hlen hstrlen hrandfield hscan",
		"sorted sets":                          "zadd zincrby zrem zscore zmscore zcard zcount zrange zrangestore zrevrange zrangebyscore zrevrangebyscore zrangebylex zrank zrevrank zpopmin zpopmax bzpopmin bzpopmax zmpop bzmpop zscan zunionstore zinterstore zdiffstore zlexcount zremrangebyrank zremrangebyscore zrandmember",
		"streams":                              "xadd xread xreadgroup xrange xrevrange xlen xdel xtrim xgroup xack xpending xclaim xautoclaim xinfo",
		"publish/subscribe":                    "subscribe unsubscribe psubscribe punsubscribe ssubscribe publish spublish pubsub",
		"scripts and functions":                "eval evalsha eval_ro evalsha_ro script function fcall fcall_ro",
		"bitmaps and HyperLogLogs":             "setbit getbit bitcount bitpos bitop bitfield pfadd pfcount pfmerge",
		"geo indexes":                          "geoadd geodist geohash geopos georadius geosearch",
	} {
		for _, n := range strings.Fields(names) {
			m[n] = kind
		}
	}
	return m
}()
