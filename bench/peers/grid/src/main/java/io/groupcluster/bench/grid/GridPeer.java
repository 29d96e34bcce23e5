package io.groupcluster.bench.grid;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

/**
 * One JVM of the grid peers of groupcluster's peers suite: an embedded member (Infinispan or Hazelcast) or a
 * remote client of one (Hot Rod, the Hazelcast Java client), driven by one-line commands on stdin.
 *
 * <pre>
 *   java ... GridPeer member infinispan|hazelcast CONFIG_FILE NAME [HOTROD_PORT]
 *   java ... GridPeer client infinispan|hazelcast CLUSTER ADDRESSES
 * </pre>
 *
 * A member prints {@code READY}, then {@code VIEW epoch_ms n} on every view and {@code STATE epoch_ms members
 * owned stable} whenever the set of segments (partitions) it holds any copy of changes or the rebalance state
 * flips; the runner takes the end of a rebalance from these lines, as it takes ours from the time the last member
 * installed the balanced topology. Commands and their one-line answers are in {@link Member} and {@link Client}.
 * The Python side ({@code groupcluster.bench.gridpeers}) generates the configuration files and parses every line.
 */
public final class GridPeer {
    static final PrintStream OUT = new PrintStream(System.out, true, StandardCharsets.UTF_8);

    static synchronized void say(String line) {
        OUT.println(line);
    }

    static double now() {
        return System.currentTimeMillis() / 1.0;
    }

    static String bulkKey(int i) {
        return String.format(Locale.ROOT, "bulk-%07d", i);
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("hazelcast.phone.home.enabled", "false");
        if (args.length < 3) {
            System.err.println("usage: GridPeer member SYSTEM CONFIG NAME [HOTROD_PORT] | client SYSTEM CLUSTER ADDRESSES");
            System.exit(2);
        }
        Store store;
        if (args[0].equals("member")) {
            store = member(args);
        } else {
            store = args[1].equals("infinispan") ? new InfinispanClient(args[3]) : new HazelcastClient(args[2], args[3]);
        }
        say("READY");
        Client ops = new Client(store);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split("\\s+");
            if (w.length == 0 || w[0].isEmpty()) continue;
            try {
                if (w[0].equals("QUIT")) break;
                if (store instanceof Member m && w[0].equals("LEAVE") && w.length > 1 && w[1].equals("stay")) {
                    // A graceful leave that keeps the JVM (and its compiled code) for a later JOIN.
                    m.close();
                    say("LEFT");
                    continue;
                }
                if (store instanceof Member && w[0].equals("JOIN")) {
                    store = member(args);
                    ops = new Client(store);
                    say("READY");
                    continue;
                }
                if (store instanceof Member m && m.command(w)) continue;
                if (!ops.command(w)) say("ERROR unknown command " + w[0]);
            } catch (Exception e) {
                e.printStackTrace();
                say("ERROR " + e.toString().replace('\n', ' '));
            }
        }
        store.close();
        say("BYE");
        System.exit(0);
    }

    static Member member(String[] args) throws Exception {
        int hotrod = args.length > 4 ? Integer.parseInt(args[4]) : 0;
        Member m = args[1].equals("infinispan") ? new InfinispanMember(args[2], hotrod) : new HazelcastMember(args[2]);
        m.startMonitor();
        return m;
    }

    /** What both embedded members and remote clients offer to the workloads. */
    interface Store {
        CompletionStage<?> putAsync(String key, byte[] value);

        CompletionStage<?> getAsync(String key);

        CompletionStage<?> putAllAsync(Map<String, byte[]> entries);

        CompletionStage<? extends Map<String, byte[]>> getAllAsync(List<String> keys);

        void putAll(Map<String, byte[]> entries);

        void close();
    }

    /** An embedded member: loads, reports what it holds, leaves. */
    abstract static class Member implements Store {
        private String lastState = "";
        volatile boolean closed;

        /** Members in the view, segments (partitions) held in any copy, and whether no rebalance is running. */
        abstract int members();

        abstract int[] owned();

        abstract boolean stable();

        abstract boolean safe();

        abstract int[] segmentCounts(int n);

        void startMonitor() {
            Thread t = new Thread(() -> {
                while (!closed) {
                    try {
                        int[] own = owned();
                        String state = members() + " " + own.length + " " + (stable() ? 1 : 0) + " " + Arrays.hashCode(own);
                        if (!state.equals(lastState)) {
                            lastState = state;
                            String[] p = state.split(" ");
                            say(String.format(Locale.ROOT, "STATE %.0f %s %s %s", now(), p[0], p[1], p[2]));
                        }
                        Thread.sleep(5);
                    } catch (InterruptedException e) {
                        return;
                    } catch (Exception e) {
                        // Not started yet or shutting down: the next poll tells.
                        try {
                            Thread.sleep(50);
                        } catch (InterruptedException ie) {
                            return;
                        }
                    }
                }
            }, "state-monitor");
            t.setDaemon(true);
            t.start();
        }

        /**
         * {@code LOAD n size}: n entries bulk-0000000... of size bytes, 2000 per putAll; answers {@code LOADED ms}.
         * {@code SEGCOUNTS n}: how many of those keys each segment holds; {@code OWNED}: the segments held here;
         * {@code SAFE}: no migration or rebalance pending; {@code LEAVE}: a graceful leave, then the JVM exits
         * ({@code LEAVE stay}: the JVM stays, and {@code JOIN} starts a new member in it, with warm code).
         */
        boolean command(String[] w) {
            switch (w[0]) {
                case "LOAD": {
                    int n = Integer.parseInt(w[1]);
                    byte[] value = new byte[Integer.parseInt(w[2])];
                    Arrays.fill(value, (byte) 'v');
                    long t0 = System.nanoTime();
                    Map<String, byte[]> batch = new HashMap<>();
                    for (int i = 0; i < n; i++) {
                        batch.put(bulkKey(i), value);
                        if (batch.size() == 2000 || i == n - 1) {
                            putAll(batch);
                            batch = new HashMap<>();
                        }
                    }
                    say(String.format(Locale.ROOT, "LOADED %.1f", (System.nanoTime() - t0) / 1e6));
                    return true;
                }
                case "SEGCOUNTS":
                    say("SEGCOUNTS " + Arrays.toString(segmentCounts(Integer.parseInt(w[1]))).replace(" ", ""));
                    return true;
                case "OWNED":
                    say("OWNED " + Arrays.toString(owned()).replace(" ", ""));
                    return true;
                case "SAFE":
                    say("SAFE " + safe());
                    return true;
                case "LEAVE":
                    close();
                    say("LEFT");
                    System.exit(0);
                    return true;
                default:
                    return false;
            }
        }
    }

    // -- Infinispan ----------------------------------------------------------------------------------------
    static final class InfinispanMember extends Member {
        final org.infinispan.manager.DefaultCacheManager manager;
        final org.infinispan.AdvancedCache<String, byte[]> cache;
        final org.infinispan.server.hotrod.HotRodServer hotrod;

        @org.infinispan.notifications.Listener
        public static final class Views {
            @org.infinispan.notifications.cachemanagerlistener.annotation.ViewChanged
            public void changed(org.infinispan.notifications.cachemanagerlistener.event.ViewChangedEvent e) {
                say(String.format(Locale.ROOT, "VIEW %.0f %d", now(), e.getNewMembers().size()));
            }
        }

        InfinispanMember(String config, int hotrodPort) throws Exception {
            manager = new org.infinispan.manager.DefaultCacheManager(config, false);
            manager.addListener(new Views());
            manager.start();
            say(String.format(Locale.ROOT, "VIEW %.0f %d", now(), manager.getMembers().size()));
            org.infinispan.Cache<String, byte[]> c = manager.getCache("bench");
            cache = c.getAdvancedCache();
            if (hotrodPort > 0) {
                var builder = new org.infinispan.server.hotrod.configuration.HotRodServerConfigurationBuilder();
                builder.host("127.0.0.1").port(hotrodPort).defaultCacheName("bench");
                hotrod = new org.infinispan.server.hotrod.HotRodServer();
                hotrod.start(builder.build(), manager);
            } else {
                hotrod = null;
            }
        }

        org.infinispan.distribution.LocalizedCacheTopology topology() {
            return cache.getDistributionManager().getCacheTopology();
        }

        @Override
        int members() {
            return topology().getMembers().size();
        }

        @Override
        int[] owned() {
            return topology().getLocalReadSegments().intStream().sorted().toArray();
        }

        @Override
        boolean stable() {
            return topology().getPhase() == org.infinispan.topology.CacheTopology.Phase.NO_REBALANCE;
        }

        @Override
        boolean safe() {
            return stable() && !cache.getDistributionManager().isRehashInProgress();
        }

        @Override
        int[] segmentCounts(int n) {
            var top = topology();
            int[] counts = new int[top.getNumSegments()];
            for (int i = 0; i < n; i++) counts[top.getSegment(bulkKey(i))]++;
            return counts;
        }

        @Override
        public CompletionStage<?> putAsync(String key, byte[] value) {
            return cache.putAsync(key, value);
        }

        @Override
        public CompletionStage<?> getAsync(String key) {
            return cache.getAsync(key);
        }

        @Override
        public CompletionStage<?> putAllAsync(Map<String, byte[]> entries) {
            return cache.putAllAsync(entries);
        }

        @Override
        public CompletionStage<? extends Map<String, byte[]>> getAllAsync(List<String> keys) {
            return cache.getAllAsync(new java.util.HashSet<>(keys));
        }

        @Override
        public void putAll(Map<String, byte[]> entries) {
            cache.putAll(entries);
        }

        @Override
        public void close() {
            closed = true;
            if (hotrod != null) hotrod.stop();
            manager.stop();
        }
    }

    static final class InfinispanClient implements Store {
        final org.infinispan.client.hotrod.RemoteCacheManager manager;
        final org.infinispan.client.hotrod.RemoteCache<String, byte[]> cache;

        InfinispanClient(String addresses) {
            var b = new org.infinispan.client.hotrod.configuration.ConfigurationBuilder();
            b.addServers(addresses);
            // Hot Rod gives up on a request after 2 s by default; on the loaded 2-core machine a batch of 1000
            // waits longer in line. Our client waits 35 s per request, Hazelcast's 120 s: the same order here.
            b.socketTimeout(35_000);
            manager = new org.infinispan.client.hotrod.RemoteCacheManager(b.build());
            cache = manager.getCache("bench");
            cache.put("warm-up", new byte[1]);
        }

        @Override
        public CompletionStage<?> putAsync(String key, byte[] value) {
            return cache.putAsync(key, value);
        }

        @Override
        public CompletionStage<?> getAsync(String key) {
            return cache.getAsync(key);
        }

        @Override
        public CompletionStage<?> putAllAsync(Map<String, byte[]> entries) {
            return cache.putAllAsync(entries);
        }

        @Override
        public CompletionStage<? extends Map<String, byte[]>> getAllAsync(List<String> keys) {
            return cache.getAllAsync(new java.util.HashSet<>(keys));
        }

        @Override
        public void putAll(Map<String, byte[]> entries) {
            cache.putAll(entries);
        }

        @Override
        public void close() {
            manager.stop();
        }
    }

    // -- Hazelcast -----------------------------------------------------------------------------------------
    static final class HazelcastMember extends Member {
        final com.hazelcast.core.HazelcastInstance hz;
        final com.hazelcast.map.IMap<String, byte[]> map;
        final com.hazelcast.internal.partition.InternalPartitionService partitions;
        final com.hazelcast.internal.partition.PartitionReplica self;
        final int partitionCount;

        HazelcastMember(String config) throws Exception {
            var cfg = new com.hazelcast.config.FileSystemXmlConfig(config);
            cfg.addListenerConfig(new com.hazelcast.config.ListenerConfig(new com.hazelcast.cluster.MembershipListener() {
                @Override
                public void memberAdded(com.hazelcast.cluster.MembershipEvent e) {
                    say(String.format(Locale.ROOT, "VIEW %.0f %d", now(), e.getMembers().size()));
                }

                @Override
                public void memberRemoved(com.hazelcast.cluster.MembershipEvent e) {
                    say(String.format(Locale.ROOT, "VIEW %.0f %d", now(), e.getMembers().size()));
                }
            }));
            hz = com.hazelcast.core.Hazelcast.newHazelcastInstance(cfg);
            say(String.format(Locale.ROOT, "VIEW %.0f %d", now(), hz.getCluster().getMembers().size()));
            map = hz.getMap("bench");
            // Hazelcast assigns partitions on first use; asking for an owner makes it arrange them now, so
            // the members report what they hold before the load.
            hz.getPartitionService().getPartition("arrange").getOwner();
            var node = ((com.hazelcast.instance.impl.HazelcastInstanceProxy) hz).getOriginal().node;
            partitions = node.getPartitionService();
            self = com.hazelcast.internal.partition.PartitionReplica.from(node.getLocalMember());
            partitionCount = partitions.getPartitionCount();
        }

        @Override
        int members() {
            return hz.getCluster().getMembers().size();
        }

        @Override
        int[] owned() {
            List<Integer> own = new ArrayList<>();
            for (int p = 0; p < partitionCount; p++) {
                if (partitions.getPartition(p, false).isOwnerOrBackup(self)) own.add(p);
            }
            return own.stream().mapToInt(Integer::intValue).toArray();
        }

        @Override
        boolean stable() {
            return !partitions.hasOnGoingMigrationLocal() && partitions.getMigrationQueueSize() == 0;
        }

        @Override
        boolean safe() {
            return hz.getPartitionService().isClusterSafe();
        }

        @Override
        int[] segmentCounts(int n) {
            int[] counts = new int[partitionCount];
            var ps = hz.getPartitionService();
            for (int i = 0; i < n; i++) counts[ps.getPartition(bulkKey(i)).getPartitionId()]++;
            return counts;
        }

        @Override
        public CompletionStage<?> putAsync(String key, byte[] value) {
            return map.putAsync(key, value);
        }

        @Override
        public CompletionStage<?> getAsync(String key) {
            return map.getAsync(key);
        }

        @Override
        public CompletionStage<?> putAllAsync(Map<String, byte[]> entries) {
            return map.putAllAsync(entries);
        }

        @Override
        public CompletionStage<? extends Map<String, byte[]>> getAllAsync(List<String> keys) {
            return java.util.concurrent.CompletableFuture.supplyAsync(() -> map.getAll(new java.util.HashSet<>(keys)));
        }

        @Override
        public void putAll(Map<String, byte[]> entries) {
            map.putAll(entries);
        }

        @Override
        public void close() {
            closed = true;
            hz.shutdown();
        }
    }

    static final class HazelcastClient implements Store {
        final com.hazelcast.core.HazelcastInstance client;
        final com.hazelcast.map.IMap<String, byte[]> map;
        final java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newFixedThreadPool(8);

        HazelcastClient(String cluster, String addresses) {
            var cfg = new com.hazelcast.client.config.ClientConfig();
            cfg.setClusterName(cluster);
            cfg.setProperty("hazelcast.phone.home.enabled", "false");
            for (String a : addresses.split(",")) cfg.getNetworkConfig().addAddress(a);
            client = com.hazelcast.client.HazelcastClient.newHazelcastClient(cfg);
            map = client.getMap("bench");
            map.put("warm-up", new byte[1]);
        }

        @Override
        public CompletionStage<?> putAsync(String key, byte[] value) {
            return map.putAsync(key, value);
        }

        @Override
        public CompletionStage<?> getAsync(String key) {
            return map.getAsync(key);
        }

        @Override
        public CompletionStage<?> putAllAsync(Map<String, byte[]> entries) {
            return map.putAllAsync(entries);
        }

        @Override
        public CompletionStage<? extends Map<String, byte[]>> getAllAsync(List<String> keys) {
            // IMap has no getAllAsync: the blocking getAll on a pool keeps as many batches in flight.
            return java.util.concurrent.CompletableFuture.supplyAsync(() -> map.getAll(new java.util.HashSet<>(keys)), pool);
        }

        @Override
        public void putAll(Map<String, byte[]> entries) {
            map.putAll(entries);
        }

        @Override
        public void close() {
            pool.shutdownNow();
            client.shutdown();
        }
    }

    // -- workloads -----------------------------------------------------------------------------------------

    /**
     * The client side of the workloads, the same for every system.
     *
     * <ul>
     *   <li>{@code WRITE rate size}: single PUTs of keys lat-0..lat-9999, one at a time, {@code rate} per second,
     *       until {@code STOPWRITE}, which answers {@code SAMPLES [[start_epoch_ms, ms, ok], ...]};
     *   <li>{@code OPS step n size inflight batch prefix}: {@code step} single-put, single-get, batch-put or
     *       batch-get over keys prefix0..prefix(n-1), {@code inflight} requests (batches of {@code batch} keys)
     *       in flight; answers {@code DONE {"start":..,"end":..,"ops":..,"errors":..,"p50_ms":..,"p99_ms":..}}.
     * </ul>
     */
    static final class Client {
        final Store store;
        volatile boolean writing;
        Thread writer;
        final List<double[]> samples = new ArrayList<>();

        Client(Store store) {
            this.store = store;
        }

        boolean command(String[] w) throws Exception {
            switch (w[0]) {
                case "WRITE":
                    startWriter(Double.parseDouble(w[1]), Integer.parseInt(w[2]));
                    say("WRITING");
                    return true;
                case "STOPWRITE": {
                    writing = false;
                    if (writer != null) writer.join();
                    StringBuilder sb = new StringBuilder("SAMPLES [");
                    synchronized (samples) {
                        for (int i = 0; i < samples.size(); i++) {
                            double[] s = samples.get(i);
                            if (i > 0) sb.append(',');
                            sb.append(String.format(Locale.ROOT, "[%.3f,%.4f,%d]", s[0], s[1], (int) s[2]));
                        }
                        samples.clear();
                    }
                    say(sb.append(']').toString());
                    return true;
                }
                case "OPS":
                    say("DONE " + ops(w[1], Integer.parseInt(w[2]), Integer.parseInt(w[3]), Integer.parseInt(w[4]),
                            Integer.parseInt(w[5]), w[6]));
                    return true;
                default:
                    return false;
            }
        }

        void startWriter(double rate, int size) {
            byte[] value = new byte[size];
            new Random(2).nextBytes(value);
            writing = true;
            writer = new Thread(() -> {
                Random rng = new Random(1);
                long period = (long) (1e9 / rate);
                long next = System.nanoTime();
                while (writing) {
                    long wait = next - System.nanoTime();
                    if (wait > 0) {
                        try {
                            Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                        } catch (InterruptedException e) {
                            return;
                        }
                    }
                    next += period;
                    // A writer more than a second behind its schedule (a stall) starts afresh instead of
                    // sending the missed writes in a burst into the next window.
                    if (System.nanoTime() - next > 1_000_000_000L) next = System.nanoTime();
                    String key = "lat-" + rng.nextInt(10_000);
                    double t0 = now();
                    long p0 = System.nanoTime();
                    int ok = 1;
                    try {
                        store.putAsync(key, value).toCompletableFuture().get(60, java.util.concurrent.TimeUnit.SECONDS);
                    } catch (Exception e) {
                        ok = 0;
                    }
                    synchronized (samples) {
                        samples.add(new double[] {t0, (System.nanoTime() - p0) / 1e6, ok});
                    }
                }
            }, "writer");
            writer.start();
        }

        String ops(String step, int n, int size, int inflight, int batch, String prefix) throws Exception {
            byte[] value = new byte[size];
            new Random(3).nextBytes(value);
            boolean batched = step.startsWith("batch");
            boolean put = step.endsWith("put");
            int requests = batched ? (n + batch - 1) / batch : n;
            double[] lat = new double[requests];
            Semaphore sem = new Semaphore(inflight);
            AtomicInteger errors = new AtomicInteger();
            double start = now();
            for (int r = 0; r < requests; r++) {
                sem.acquire();
                final int req = r;
                final long t0 = System.nanoTime();
                Supplier<CompletionStage<?>> call;
                if (!batched) {
                    String key = prefix + r;
                    call = put ? () -> store.putAsync(key, value) : () -> store.getAsync(key);
                } else {
                    List<String> keys = new ArrayList<>(batch);
                    for (int i = r * batch; i < Math.min(n, (r + 1) * batch); i++) keys.add(prefix + i);
                    if (put) {
                        Map<String, byte[]> entries = new HashMap<>();
                        for (String k : keys) entries.put(k, value);
                        call = () -> store.putAllAsync(entries);
                    } else {
                        call = () -> store.getAllAsync(keys);
                    }
                }
                call.get().whenComplete((res, err) -> {
                    lat[req] = (System.nanoTime() - t0) / 1e6;
                    // Failed operations, counted in keys (a failed batch fails all of its keys).
                    int count = batched ? Math.min(batch, n - req * batch) : 1;
                    int failed = 0;
                    if (err != null) failed = count;
                    else if (!put) failed = batched ? count - ((Map<?, ?>) res).size() : (res == null ? 1 : 0);
                    errors.addAndGet(failed);
                    sem.release();
                });
            }
            sem.acquire(inflight);
            double end = now();
            double[] sorted = lat.clone();
            Arrays.sort(sorted);
            double p50 = sorted[Math.min(sorted.length - 1, (int) (0.50 * sorted.length))];
            double p99 = sorted[Math.min(sorted.length - 1, (int) (0.99 * sorted.length))];
            return String.format(Locale.ROOT,
                    "{\"start\":%.3f,\"end\":%.3f,\"ops\":%d,\"requests\":%d,\"errors\":%d,\"p50_ms\":%.4f,\"p99_ms\":%.4f}",
                    start, end, n, requests, errors.get(), p50, p99);
        }
    }
}
