package io.groupcluster.bench;

import java.io.File;
import org.jgroups.BytesMessage;
import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.Receiver;
import org.jgroups.View;
import org.jgroups.util.MessageBatch;

/**
 * JGroups 5 member of the peer benchmark: {@code java -cp ... io.groupcluster.bench.Harness CONFIG.xml CLUSTER
 * [Core options]}. The stack (NAKACK2 or SEQUENCER over TCP on loopback) comes from the XML file; bind port and
 * initial hosts come from the system properties it references.
 */
public final class Harness implements Receiver {
    private final Core core;

    private Harness(Core core) {
        this.core = core;
    }

    @Override
    public void receive(Message msg) {
        core.deliver(msg.getArray(), msg.getOffset(), msg.getLength(), System.nanoTime());
    }

    @Override
    public void receive(MessageBatch batch) {
        long now = System.nanoTime();
        // One lock per batch, as our stack delivers a batch in one call.
        synchronized (core) {
            for (Message msg : batch) core.deliverLocked(msg.getArray(), msg.getOffset(), msg.getLength(), now);
        }
    }

    @Override
    public void viewAccepted(View view) {
        core.viewSize(view.size());
    }

    public static void main(String[] args) throws Exception {
        String[] rest = java.util.Arrays.copyOfRange(args, 2, args.length);
        Core core = Core.parse(rest);
        JChannel ch = new JChannel(new File(args[0]).getPath());
        ch.setReceiver(new Harness(core));
        ch.connect(args[1]);
        core.viewSize(ch.getView().size());
        int code = core.run(payload -> ch.send(new BytesMessage(null, payload)));
        if (code != 0) System.exit(code);
        Core.park();
    }
}
